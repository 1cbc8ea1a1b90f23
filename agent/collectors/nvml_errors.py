"""What a failed NVML read means for the value asked, decided in one place.

NVML says why it cannot give a value with an error code: the single-value calls raise it
as a pynvml ``NVMLError`` subclass (whose ``value`` is the code), and
``nvmlDeviceGetFieldValues`` returns one per element. The GPU collector reads both the
same way, from this table:

- ABSENT: this device or driver does not have the value (NotSupported, FunctionNotFound,
  and InvalidArgument for an NVLink index the device does not have). It stays unset in
  the sample: absent, never 0.
- LOST: the GPU has fallen off the bus (GpuIsLost). The sample is marked ``lost``;
  nothing else about the GPU is readable.
- RESET_REQUIRED: the GPU needs a reset (ResetRequired). The sample is marked
  ``reset_required`` and the values it blocks are absent.
- OTHER: anything else. The value is absent and the error is logged (once per GPU,
  function and code).
"""

from __future__ import annotations

import enum

import pynvml


class Outcome(enum.Enum):
    ABSENT = "absent"
    LOST = "lost"
    RESET_REQUIRED = "reset_required"
    OTHER = "other"


_BY_CODE = {
    pynvml.NVML_ERROR_NOT_SUPPORTED: Outcome.ABSENT,
    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND: Outcome.ABSENT,
    pynvml.NVML_ERROR_GPU_IS_LOST: Outcome.LOST,
    pynvml.NVML_ERROR_RESET_REQUIRED: Outcome.RESET_REQUIRED,
}


def sort_code(code: int, *, link: bool = False) -> Outcome:
    """What an NVML return code other than success means for the value; ``link``: an NVLink-indexed read."""
    if link and code == pynvml.NVML_ERROR_INVALID_ARGUMENT:
        return Outcome.ABSENT
    return _BY_CODE.get(code, Outcome.OTHER)


def sort_error(err: BaseException, *, link: bool = False) -> Outcome:
    """``sort_code`` for a raised ``NVMLError`` (each subclass carries its code as ``value``)."""
    code = getattr(err, "value", None)
    return sort_code(code, link=link) if isinstance(code, int) else Outcome.OTHER
