"""A GPU's NVLink records as one bytes value, to tell in C whether any link changed.

Reading 18 links' state and error counters through the protobuf API costs a Python object
per link and an attribute read per field (~15 us per GPU). A full report's links become
the base that later delta reports leave unchanged links out against (controller.detect.
nvlinks), and in a healthy fleet nothing in them has changed since the last full report.
``links_key`` is the GPU's NvLinkSample records (starpulse.core.linkrecords), length-delimited
and in order, with everything else dropped (~6 us, in C). Equal keys mean the same link
records, field for field, so whatever was derived from them last time (link states,
counter values) still holds.
"""

from __future__ import annotations

from starpulse.core.linkrecords import LINKS_ONLY
from starpulse.v1 import telemetry_pb2 as tpb


def links_key(gpu: tpb.GpuSample) -> bytes:
    """The GPU's NvLinkSample records, serialized in order: equal keys, equal links."""
    links = LINKS_ONLY.FromString(gpu.SerializeToString())
    links.DiscardUnknownFields()  # the GPU's other fields
    return bytes(links.SerializeToString())
