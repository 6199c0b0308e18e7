"""What the pipelines benchmark compares: the augmentation and features every contender is set to,
the contenders (name, task, family, and how each differs from the others), and the batch shapes they
must produce.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from benchmarks import _harness

__all__ = ["CROP_SIZE", "AREA_RANGE", "RATIO_RANGE", "CROP_ATTEMPTS", "MEAN", "STD", "OUTPUTS", "BERT_SEQ_LEN",
           "BERT_MAX_PREDICTIONS", "TASKS", "Contender", "CONTENDERS", "DLSTORE_SHUFFLES", "FAMILY_LABELS",
           "missing_reason", "bert_shapes", "expected_spec", "select"]

# The augmentation every ResNet-50 contender is configured to: torchvision's RandomResizedCrop
# defaults, the ImageNet mean and std of torchvision and DALI's examples.
CROP_SIZE = 224
AREA_RANGE = (0.08, 1.0)
RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
CROP_ATTEMPTS = 10
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
OUTPUTS = ("uint8", "float")

# BERT pretraining features at sequence length 128 (Google's create_pretraining_data.py).
BERT_SEQ_LEN = 128
BERT_MAX_PREDICTIONS = 20
BERT_INT_FEATURES = ("input_ids", "input_mask", "segment_ids")
BERT_PRED_FEATURES = ("masked_lm_positions", "masked_lm_ids")

TASKS = {
    "resnet50": {"unit": "images", "title": "ResNet-50 train pipeline"},
    "bert": {"unit": "samples", "title": "BERT pretraining features"},
}


@dataclass(frozen=True)
class Contender:
    """A pipeline in the comparison: its name (``--only``, ``--worker``), task, what the tables call
    it, its family (for the ratios), whether it checks TFRecord CRCs, the module it needs, and how
    it differs from the others (the rows of docs/pipelines.md's semantics table)."""

    name: str
    task: str
    label: str
    family: str
    crc: Optional[bool]
    requires: str
    install: str
    decode: str = ""
    resize: str = ""
    output: str = ""
    shuffle: str = ""
    dlstore_shuffle: Optional[str] = None  # the Dataset's shuffle, for dlstore's rows


_DLSTORE_DECODE = ("libjpeg-turbo in C++, the crop window only, at the smallest DCT scale (1/8, 2/8, 4/8 or 8/8) "
                   "covering 224 px")
_DLSTORE_RESIZE = ("one fused pass into the batch buffer: bilinear with antialiasing (torchvision's and PIL's filter), "
                   "flip, normalise")
_DLSTORE_OUTPUT = "float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 as stored (1..1000)"
DLSTORE_SHUFFLES = {
    "none": "`Dataset(shuffle=\"none\")`: records in shard order, shards in a seeded order (the unshuffled reference)",
    "block": "`Dataset(shuffle=\"block\")`, its default: 8 MiB blocks in a seeded order within 128 MiB windows, "
             "records through a 64 MiB shuffle buffer",
    "global": "`Dataset(shuffle=\"global\")`: a seeded permutation of all records, each read through the index",
}
_PEER_SHUFFLE = "a shuffle buffer of `--shuffle-buffer` records"


def _dlstore_rows(task: str, loader: str, **semantics: str) -> List[Contender]:
    """dlstore's rows of a task, one per Dataset shuffle, the same but for the shuffle."""
    return [Contender(f"{task}-dlstore-{s}", task, f"dlstore {loader}, shuffle {s}", "dlstore", True,
                      "dlstore.pipeline", "dlstore.pipeline", shuffle=DLSTORE_SHUFFLES[s], dlstore_shuffle=s,
                      **semantics) for s in DLSTORE_SHUFFLES]


CONTENDERS: Dict[str, Contender] = {
    c.name: c
    for c in [
        *_dlstore_rows("resnet50", "resnet50_loader", decode=_DLSTORE_DECODE, resize=_DLSTORE_RESIZE,
                       output=_DLSTORE_OUTPUT),
        Contender("resnet50-dali", "resnet50", "DALI CPU", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130",
                  shuffle=f"`readers.tfrecord(random_shuffle=True, initial_fill=N)`: {_PEER_SHUFFLE}",
                  decode="`decoders.image_random_crop` (cpu, nvImageCodec/libjpeg-turbo, ROI decoding of the "
                         "crop window at full scale)",
                  resize="`resize` 224 x 224, linear with antialiasing (DALI's default); "
                         "`crop_mirror_normalize` flips and normalises",
                  output="float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 (1..1000); numpy "
                         "views of DALI's output buffers (no copy)"),
        Contender("resnet50-tfdata", "resnet50", "tf.data", "tfdata", True, "tensorflow",
                  "pip install tensorflow-cpu",
                  shuffle=f"`.shuffle(N)` on the records, before the map: {_PEER_SHUFFLE}",
                  decode="`sample_distorted_bounding_box` (whole image as the box, min_object_covered 0) + "
                         "`decode_and_crop_jpeg` (libjpeg-turbo, the crop window at full scale)",
                  resize="`tf.image.resize` bilinear, no antialiasing (TF's default); "
                         "`random_flip_left_right`; normalise in float32",
                  output="float: float32 **NHWC** (TF's layout), normalised; uint8: uint8 NHWC (resize "
                         "output rounded); label int64 (1..1000)"),
        Contender("resnet50-torch", "resnet50", "PyTorch DataLoader + PIL", "torch", False, "torch",
                  "pip install torch==2.13.0",
                  shuffle="files in a seeded order each epoch, then a shuffle buffer of N / workers records in each "
                          "worker (a DataLoader takes no `shuffle=True` with an IterableDataset)",
                  decode="`tfrecord` package (protobuf parse per record) + PIL `Image.open().convert('RGB')`: "
                         "the whole image at full scale",
                  resize="RandomResizedCrop as torchvision does it, written with PIL: `resize(BILINEAR, box=crop)` "
                         "(antialiased); flip; `ToTensor` + `Normalize` as torch ops per image",
                  output="float: float32 NCHW, normalised; uint8: uint8 NHWC; label int64 (1..1000); "
                         "collated in the workers, handed over in shared memory"),
        *_dlstore_rows("bert", "bert_loader",
                       decode="the seven features parsed in C++ straight into fixed-shape batch arrays",
                       output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)"),
        Contender("bert-dali", "bert", "DALI readers.tfrecord", "dali", False, "nvidia.dali",
                  "pip install nvidia-dali-cuda130",
                  shuffle=f"`random_shuffle=True, initial_fill=N`: {_PEER_SHUFFLE}",
                  decode="`readers.tfrecord` with the seven `FixedLenFeature`s, `device_id=None`",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1); "
                         "numpy views of DALI's output buffers (no copy)"),
        Contender("bert-tfdata", "bert", "tf.data parse_example", "tfdata", True, "tensorflow",
                  "pip install tensorflow-cpu",
                  shuffle=f"`.shuffle(N)` on the records, before `batch`: {_PEER_SHUFFLE}",
                  decode="`TFRecordDataset` -> `batch(64)` -> `parse_example` (batched parse), AUTOTUNE",
                  output="int64 (masked_lm_weights float32), next_sentence_labels (B, 1)"),
    ]
}
FAMILY_LABELS = {"dali": "DALI", "tfdata": "tf.data", "torch": "PyTorch"}


def missing_reason(c: Contender) -> Optional[str]:
    """Why a contender cannot run here (None when it can), found without importing the framework."""
    why = _harness.module_missing(c.requires, c.install)
    return None if why is None else f"not available: {why}"



def bert_shapes(plan: Dict) -> Dict[str, int]:
    """The length of each BERT feature in the plan's records."""
    return {**{k: plan["seq_len"] for k in BERT_INT_FEATURES},
            **{k: plan["max_predictions"] for k in BERT_PRED_FEATURES + ("masked_lm_weights",)},
            "next_sentence_labels": 1}


def expected_spec(plan: Dict) -> Dict[str, List]:
    """The shapes and dtypes a contender's batches must have (the ``status`` check)."""
    b = plan["batch_size"]
    if plan["task"] == "bert":
        return {k: [[b, n], "float32" if k == "masked_lm_weights" else "int64"]
                for k, n in bert_shapes(plan).items()}
    if plan["output"] == "uint8":
        image = [[b, CROP_SIZE, CROP_SIZE, 3], "uint8"]
    elif plan["family"] == "tfdata":
        image = [[b, CROP_SIZE, CROP_SIZE, 3], "float32"]
    else:
        image = [[b, 3, CROP_SIZE, CROP_SIZE], "float32"]
    return {"image": image, "label": [[b], "int64"]}


def select(only: Optional[str]) -> List[str]:
    """Contender names from ``--only`` (names, families or tasks), in table order; ValueError naming what is unknown."""
    return _harness.select(only, CONTENDERS, ("family", "task"))
