"""``python -m dlstore.bench bert|resnet50 --data GLOB --mounts A B``: the target tier reads through
``dlstore.Dataset`` over the mounts (here two directories holding the same shards)."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from dlstore.synthetic import cached_dataset

from tests.helpers import REPO

pytestmark = pytest.mark.slow  # runs the bench in subprocesses


@pytest.mark.parametrize("scenario, kind", [("bert", "bert"), ("resnet50", "imagenet")])
def test_target_tier_over_two_mounts(tmp_path, scenario, kind):
    files = cached_dataset(kind, "tiny", progress=False)
    mounts = []
    for m in range(2):
        d = tmp_path / f"mnt{m}"
        d.mkdir()
        for f in files:
            shutil.copy(f, d)
        mounts.append(os.fspath(d))
    pattern = os.path.basename(files[0]).split("-")[0] + "-*"
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "dlstore.bench", scenario, "--size", "tiny", "--data", pattern,
                           "--mounts", *mounts, "--json", os.fspath(out), "--quiet"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    tiers = {t["tier"]: t for t in doc["tiers"]}
    assert set(tiers) == {"page-cache", "local-cold", "target"}
    rate = "samples_per_s" if scenario == "bert" else "images_per_s"
    assert tiers["target"][rate] > 0 and tiers["target"]["steps"]
