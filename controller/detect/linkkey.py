"""A GPU's NVLink records as one bytes value, to tell in C whether any link changed.

Reading 18 links' state and error counters through the protobuf API costs a Python object
per link and an attribute read per field (~15 us per GPU); on a full report (whose links
become the base later delta reports leave unchanged links out against, controller.detect.
nvlinks) that is most of a GPU's cost, and in a healthy fleet nothing in them has changed
since the last full report. ``links_key`` re-serializes the GPU sample and parses it back as a private message
type whose only field is the ``nvlinks`` field number as ``repeated bytes``: the result is
each NvLinkSample record, length-delimited and in order, with everything else dropped (~7 us).
Equal keys mean the same link records, field for field, so whatever was derived from them
last time (link states, counter values) still holds.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from starpulse.v1 import telemetry_pb2 as tpb


def _links_only_class() -> Any:
    number = tpb.GpuSample.DESCRIPTOR.fields_by_name["nvlinks"].number
    fdp = descriptor_pb2.FileDescriptorProto(
        name="starpulse_detect_links_only.proto", package="starpulse.detect.private", syntax="proto3"
    )
    msg = fdp.message_type.add(name="GpuLinksOnly")
    msg.field.add(
        name="nvlinks",
        number=number,
        type=descriptor_pb2.FieldDescriptorProto.TYPE_BYTES,
        label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
    )
    pool = descriptor_pool.DescriptorPool()  # private: nothing else sees this type
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("starpulse.detect.private.GpuLinksOnly"))


_LINKS_ONLY = _links_only_class()


def links_key(gpu: tpb.GpuSample) -> bytes:
    """The GPU's NvLinkSample records, serialized in order: equal keys, equal links."""
    links = _LINKS_ONLY.FromString(gpu.SerializeToString())
    links.DiscardUnknownFields()  # the GPU's other fields
    return bytes(links.SerializeToString())
