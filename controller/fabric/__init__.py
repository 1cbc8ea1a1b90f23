"""The fabric model: declared multi-rail Clos wiring, its file format, and LLDP reconciliation."""

from controller.fabric.generate import generate_fabric
from controller.fabric.io import FabricFileError, fabric_from_dict, fabric_to_dict, load_fabric, save_fabric
from controller.fabric.model import Fabric, FabricError, WiringChange
from controller.fabric.reconcile import (
    LearnedEdge,
    MissingLink,
    Miswire,
    ReconcileReport,
    UnknownDevice,
    reconcile,
)

__all__ = [
    "Fabric",
    "FabricError",
    "FabricFileError",
    "LearnedEdge",
    "MissingLink",
    "Miswire",
    "ReconcileReport",
    "UnknownDevice",
    "WiringChange",
    "fabric_from_dict",
    "fabric_to_dict",
    "generate_fabric",
    "load_fabric",
    "reconcile",
    "save_fabric",
]
