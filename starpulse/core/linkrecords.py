"""A GPU sample's NVLink records as bytes, one per link, without a Python object per link.

Iterating ``GpuSample.nvlinks`` makes a Python wrapper per link, and reading its fields an
attribute call per field. Serializing the GPU sample and parsing it back as a private
message type whose only field is the ``nvlinks`` field number, as ``repeated bytes``, gives
each NvLinkSample record, serialized and in order, with the GPU's other fields dropped (as
unknown fields), all in C. Two records are equal bytes exactly when every field, and every
optional counter's presence, is equal (NvLinkSample has no map, so serialization is
deterministic). The agent's delta encoder compares these lists against the last full
report; the controller's ``links_key`` is these records as one bytes value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from starpulse.v1 import telemetry_pb2 as tpb


def _links_only_class() -> Any:
    number = tpb.GpuSample.DESCRIPTOR.fields_by_name["nvlinks"].number
    fdp = descriptor_pb2.FileDescriptorProto(
        name="starpulse_links_only.proto", package="starpulse.private", syntax="proto3"
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
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("starpulse.private.GpuLinksOnly"))


LINKS_ONLY = _links_only_class()
_parse = LINKS_ONLY.FromString


def link_records(gpu: tpb.GpuSample) -> Sequence[bytes]:
    """Each of the GPU's NvLinkSample records, serialized, in report order (a read-only
    repeated container: compare it with a list of bytes, or ``list()`` it to keep it)."""
    return _parse(gpu.SerializeToString()).nvlinks
