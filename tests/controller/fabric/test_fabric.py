"""The fabric model, its generator and its file format."""

from __future__ import annotations

import json
import re

import networkx as nx
import pytest

from controller.fabric import (
    Fabric,
    FabricError,
    FabricFileError,
    fabric_to_dict,
    generate_fabric,
    load_fabric,
    save_fabric,
)


@pytest.fixture(scope="module")
def f32() -> Fabric:
    return generate_fabric(32, gpus_per_node=8, rails=8, nodes_per_block=16, spines=8)


class TestGenerateFabric:
    def test_counts_for_two_blocks(self, f32):
        """32 nodes, 16 per block, 8 rails: 2 blocks, 16 leaves, 8 spines, 8 GPUs and NICs per node."""
        assert f32.summary() == {
            "node": 32,
            "gpu": 256,
            "nic": 256,
            "leaf": 16,
            "spine": 8,
            "spares": 0,
            "links": 32 * 8 * 4 + 16 * 8,
            "blocks": 2,
            "rails": 8,
        }

    def test_names(self, f32):
        """Vertex names are stable and exact."""
        assert f32.nodes()[:2] == ["node-000", "node-001"]
        assert f32.nodes()[-1] == "node-031"
        assert f32.gpus_of("node-003")[5] == "node-003/gpu-5"
        assert f32.nics_of("node-003") == [f"node-003/nic-{i}" for i in range(8)]
        assert f32.leaves() == [f"leaf-b{b}-r{r}" for b in range(2) for r in range(8)]
        assert f32.spines() == [f"spine-{k}" for k in range(8)]

    def test_rail_adjacency(self, f32):
        """NIC i of a node is on its block's rail-i leaf, at port Ethernet{4*slot}."""
        assert f32.leaf_of("node-003/nic-5") == "leaf-b0-r5"
        assert f32.port_of("node-003/nic-5") == "Ethernet12"
        assert f32.leaf_of("node-020/nic-0") == "leaf-b1-r0"
        assert f32.port_of("node-020/nic-0") == "Ethernet16"
        assert f32.rail_of("node-003/nic-5") == 5
        assert f32.peer_at("leaf-b0-r5", "Ethernet12") == "node-003/nic-5"
        assert f32.nics_on_leaf("leaf-b1-r2") == [f"node-{i:03d}/nic-2" for i in range(16, 32)]

    def test_blocks(self, f32):
        """Nodes 0-15 are block 0 and 16-31 block 1; GPUs, NICs and leaves have blocks too."""
        assert f32.block_of("node-015") == 0
        assert f32.block_of("node-020") == 1
        assert f32.block_of("node-020/gpu-3") == 1
        assert f32.block_of("leaf-b1-r7") == 1
        assert f32.blocks() == [0, 1]
        assert f32.nodes_in_block(1)[0] == "node-016"

    def test_gpu_nic_pairing(self, f32):
        """GPU i pairs with NIC i over PCIe."""
        assert f32.nic_of_gpu("node-003/gpu-5") == "node-003/nic-5"
        assert f32.gpus_of_nic("node-003/nic-5") == ["node-003/gpu-5"]
        assert f32.host_of("node-003/gpu-5") == "node-003"

    def test_leaf_spine_full_mesh(self, f32):
        """Every leaf connects to every spine, with uplink ports after the host ports."""
        assert f32.spines_of("leaf-b0-r0") == [f"spine-{k}" for k in range(8)]
        assert len(f32.leaves_of("spine-3")) == 16
        assert f32.peer_at("leaf-b0-r0", "Ethernet64") == "spine-0"
        assert f32.peer_at("spine-2", "Ethernet36") == "leaf-b1-r1"

    def test_nodes_behind(self, f32):
        """A leaf carries its block's nodes; a spine carries every node behind its leaves."""
        assert f32.nodes_behind("leaf-b1-r4") == [f"node-{i:03d}" for i in range(16, 32)]
        assert f32.nodes_behind("spine-0") == f32.nodes()
        with pytest.raises(KeyError, match="not a switch"):
            f32.nodes_behind("node-000")

    def test_component_types_and_links(self, f32):
        """Components map to gpu/nic/node/switch/link; link names are canonical either way round."""
        assert f32.component_type("node-000") == "node"
        assert f32.component_type("node-000/gpu-1") == "gpu"
        assert f32.component_type("node-000/nic-1") == "nic"
        assert f32.component_type("leaf-b0-r1") == "switch"
        assert f32.component_type("spine-1") == "switch"
        link = f32.link_name("leaf-b0-r1", "node-000/nic-1")
        assert link == "node-000/nic-1<->leaf-b0-r1" == f32.link_name("node-000/nic-1", "leaf-b0-r1")
        assert f32.link_name("spine-0", "leaf-b0-r0") == "leaf-b0-r0<->spine-0"
        assert f32.component_type(link) == "link"
        assert Fabric.link_ends(link) == ("node-000/nic-1", "leaf-b0-r1")
        assert f32.kind("leaf-b0-r1") == "leaf"
        with pytest.raises(KeyError, match="not in the fabric"):
            f32.component_type("node-999")

    def test_spares_continue_numbering(self):
        """Spares are named after the regular nodes, flagged spare, and fill blocks the same way."""
        f = generate_fabric(30, spares=4, nodes_per_block=16)
        assert f.spares() == ["node-030", "node-031", "node-032", "node-033"]
        assert not f.is_spare("node-029")
        assert f.block_of("node-031") == 1
        assert f.block_of("node-032") == 2
        assert f.leaf_of("node-032/nic-0") == "leaf-b2-r0"
        assert f.summary()["node"] == 34

    def test_name_width_grows(self):
        """More than 1000 nodes widens the number to keep names sortable."""
        f = generate_fabric(1001, gpus_per_node=1, rails=1, nodes_per_block=64, spines=1)
        assert f.nodes()[0] == "node-0000"
        assert f.nodes()[-1] == "node-1000"

    def test_fewer_rails_than_gpus(self):
        """With 4 rails and 8 GPUs, nodes have 4 NICs and GPU i pairs with NIC i % 4."""
        f = generate_fabric(2, gpus_per_node=8, rails=4, nodes_per_block=2, spines=2)
        assert len(f.nics_of("node-000")) == 4
        assert f.nic_of_gpu("node-000/gpu-6") == "node-000/nic-2"
        assert f.gpus_of_nic("node-000/nic-2") == ["node-000/gpu-2", "node-000/gpu-6"]
        assert f.leaves() == [f"leaf-b0-r{r}" for r in range(4)]

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"nodes": 0}, "nodes must be >= 1"),
            ({"nodes": 4, "rails": 0}, "rails must be >= 1"),
            ({"nodes": 4, "gpus_per_node": -1}, "gpus_per_node must be >= 1"),
            ({"nodes": 4, "nodes_per_block": 0}, "nodes_per_block must be >= 1"),
            ({"nodes": 4, "spines": -1}, "spines must be >= 0"),
            ({"nodes": 4, "spares": -2}, "spares must be >= 0"),
            ({"nodes": 4.0}, "nodes must be an integer"),
            ({"nodes": True}, "nodes must be an integer"),
        ],
    )
    def test_invalid_arguments(self, kwargs, match):
        """Bad generator arguments raise ValueError naming the argument."""
        with pytest.raises(ValueError, match=match):
            generate_fabric(**kwargs)

    def test_large_fabric(self):
        """2,048 nodes x 8 GPUs builds, with the expected counts and O(1) lookups."""
        f = generate_fabric(2048, gpus_per_node=8, rails=8, nodes_per_block=16, spines=8)
        s = f.summary()
        assert (s["node"], s["gpu"], s["nic"], s["leaf"], s["spine"], s["blocks"]) == (
            2048,
            16384,
            16384,
            1024,
            8,
            128,
        )
        assert f.leaf_of("node-2047/nic-7") == "leaf-b127-r7"
        assert len(f.nodes_behind("leaf-b127-r7")) == 16


class TestFabricModel:
    def test_rejects_unknown_vertex_kind(self):
        """Wrapping a graph with an unknown vertex kind fails with the vertex name."""
        g = nx.Graph()
        g.add_node("router-1", kind="router")
        with pytest.raises(FabricError, match="'router-1': unknown kind 'router'"):
            Fabric(g)

    def test_rejects_missing_attribute(self):
        """A vertex without a required attribute is rejected."""
        g = nx.Graph()
        g.add_node("leaf-x", kind="leaf", block=0)
        with pytest.raises(FabricError, match="attribute 'rail' must be int"):
            Fabric(g)

    def test_rejects_nic_on_two_leaves(self, f32):
        """A NIC cabled to two leaves is not a rail fabric."""
        g = f32.graph.copy()
        g.add_edge("node-000/nic-0", "leaf-b0-r1", kind="nic-leaf", port="Ethernet120")
        with pytest.raises(FabricError, match="cabled to two leaves"):
            Fabric(g)

    def test_rewire_nic_updates_indexes(self):
        """rewire_nic moves the NIC's cable and every index follows."""
        f = generate_fabric(4, nodes_per_block=4, spines=1)
        change = f.rewire_nic("node-001/nic-3", "leaf-b0-r4", "Ethernet40")
        assert change is not None and change.old_peer == "leaf-b0-r3"
        assert f.leaf_of("node-001/nic-3") == "leaf-b0-r4"
        assert f.port_of("node-001/nic-3") == "Ethernet40"
        assert "node-001/nic-3" not in f.nics_on_leaf("leaf-b0-r3")
        assert "node-001/nic-3" in f.nics_on_leaf("leaf-b0-r4")
        assert f.peer_at("leaf-b0-r3", "Ethernet4") is None
        assert f.nodes_behind("leaf-b0-r3") == ["node-000", "node-002", "node-003"]
        assert f.rewire_nic("node-001/nic-3", "leaf-b0-r4", "Ethernet40") is None


class TestFabricFiles:
    def test_json_round_trip(self, f32, tmp_path):
        """Saving and loading JSON gives an equal fabric and the same file again."""
        path = tmp_path / "fabric.json"
        save_fabric(f32, path)
        loaded = load_fabric(path)
        assert loaded == f32
        assert fabric_to_dict(loaded) == fabric_to_dict(f32)
        assert loaded.leaf_of("node-003/nic-5") == "leaf-b0-r5"
        data = json.loads(path.read_text())
        assert data["version"] == 1
        assert data["params"]["nodes"] == 32
        assert {"name": "leaf-b0-r5", "kind": "leaf", "block": 0, "rail": 5} in data["vertices"]

    def test_yaml_round_trip(self, tmp_path):
        """YAML files load to the same fabric as JSON."""
        f = generate_fabric(4, nodes_per_block=2, spines=2, spares=1)
        path = tmp_path / "fabric.yaml"
        save_fabric(f, path)
        assert load_fabric(path) == f

    def test_hand_written_yaml(self, tmp_path):
        """A small hand-written YAML fabric loads, with 'nodes' accepted for 'vertices'."""
        path = tmp_path / "tiny.yml"
        path.write_text(
            "version: 1\n"
            "nodes:\n"
            "  - {name: node-000, kind: node, block: 0, spare: false}\n"
            "  - {name: node-000/nic-0, kind: nic, host: node-000, index: 0, rail: 0}\n"
            "  - {name: leaf-b0-r0, kind: leaf, block: 0, rail: 0}\n"
            "links:\n"
            "  - {a: node-000, b: node-000/nic-0, kind: node-nic}\n"
            "  - {a: node-000/nic-0, b: leaf-b0-r0, kind: nic-leaf, port: Ethernet0}\n"
        )
        f = load_fabric(path)
        assert f.leaf_of("node-000/nic-0") == "leaf-b0-r0"
        assert f.params == {}

    @pytest.mark.parametrize(
        ("mutate", "match"),
        [
            (
                lambda d: d["vertices"][0].update(kind="router"),
                "vertices[0].kind: must be one of node, gpu, nic, leaf, spine, got 'router'",
            ),
            (lambda d: d["vertices"].append(dict(d["vertices"][0])), "name: duplicate vertex name 'leaf-b0-r0'"),
            (
                lambda d: d["links"][0].update(b="node-999/nic-0"),
                "links[0].b: must name a vertex, got 'node-999/nic-0'",
            ),
            (lambda d: d["links"].append(dict(d["links"][0])), "duplicate link"),
            (lambda d: d["links"][0].update(kind="nvlink"), "links[0].kind: must be one of gpu-nic"),
            (lambda d: d.update(version=2), "version: must be one of 1, got 2"),
            (lambda d: d["vertices"][0].pop("rail"), "vertices[0].rail: must be an integer on a leaf vertex, got None"),
        ],
    )
    def test_load_errors_name_file_and_problem(self, tmp_path, mutate, match):
        """A broken fabric file fails with FabricFileError naming the file and the problem."""
        data = fabric_to_dict(generate_fabric(2, nodes_per_block=2, spines=1))
        mutate(data)
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(data))
        with pytest.raises(FabricFileError, match=re.escape(match)) as exc:
            load_fabric(path)
        assert str(exc.value).startswith(str(path))

    def test_every_error_of_a_file_in_one_run(self, tmp_path):
        """Each vertex and link problem is its own line, naming the file and the key."""
        data = fabric_to_dict(generate_fabric(2, nodes_per_block=2, spines=1))
        data["vertices"][0].update(kind="router")
        data["vertices"][1].pop("rail")
        data["links"][0].update(kind="nvlink", a=7)
        data["params"] = []
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(data))
        with pytest.raises(FabricFileError) as exc:
            load_fabric(path)
        assert [line.removeprefix(f"{path}: ").split(":")[0] for line in exc.value.errors] == [
            "params",
            "vertices[0].kind",
            "vertices[1].rail",
            "links[0].a",
            "links[0].kind",
        ]

    def test_unreadable_and_malformed_files(self, tmp_path):
        """A missing file and invalid JSON/YAML are FabricFileErrors too."""
        with pytest.raises(FabricFileError, match="cannot read"):
            load_fabric(tmp_path / "absent.json")
        bad = tmp_path / "bad.json"
        bad.write_text("{not json")
        with pytest.raises(FabricFileError, match="not valid JSON"):
            load_fabric(bad)
        bad_yaml = tmp_path / "bad.yaml"
        bad_yaml.write_text("version: [1\n")
        with pytest.raises(FabricFileError, match="not valid YAML"):
            load_fabric(bad_yaml)
