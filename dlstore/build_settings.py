"""The environment variables read when the C++ core is built.

setup.py loads this file on its own (the package cannot be imported before it is built), and
:func:`dlstore.settings.markdown_table` lists them in docs/settings.md: one definition for both.
Each entry: the variable, then (its default in words, what it does).
"""

BUILD_JOBS_DEFAULT = 2

BUILD_VARIABLES = {
    "DLSTORE_BUILD_JOBS": (str(BUILD_JOBS_DEFAULT), "Compiler processes building the C++ core at once."),
    "DLSTORE_WITHOUT_JPEG": ("unset", "Set: build without libjpeg-turbo even where it is found; the ResNet-50 "
                                      "pipeline then decodes with Pillow and says so."),
    "DLSTORE_SANITIZE": ("unset", "Set: build with AddressSanitizer and UBSan, for the CI's sanitizer run "
                                  "(`.ci/sanitize`)."),
}
