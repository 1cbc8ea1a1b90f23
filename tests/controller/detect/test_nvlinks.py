"""A GPU's links as detection sees them: a full report's rows, and a delta's laid over them."""

from __future__ import annotations

from controller.detect.nvlinks import from_rows, overlay


def rows(n: int = 4, down: tuple[int, ...] = (), first: int = 0) -> list[tuple[int, bool, int, int]]:
    """(link, up, replay, crc) per link."""
    return [(first + i, first + i not in down, 10 * i, 0) for i in range(n)]


class TestLinks:
    def test_from_rows(self) -> None:
        links = from_rows(b"k", rows(down=(2,)), 2)
        assert links.numbers == (0, 1, 2, 3)
        assert links.down == (2,)
        assert links.values == (0, 0, 10, 0, 20, 0, 30, 0)  # link by link, the rate names' order

    def test_healthy_gpus_share_their_numbering_and_states(self) -> None:
        a, b = from_rows(b"a", rows(), 2), from_rows(b"b", rows(), 2)
        assert a.numbers is b.numbers and a.ups is b.ups and a.down == ()

    def test_overlay_replaces_links_by_number(self) -> None:
        base = from_rows(b"k", rows(first=100), 2)
        view = overlay(base, [(102, False, 20, 7)])
        assert view is not None
        assert view.down == (102,) and view.numbers == base.numbers
        assert view.values == (0, 0, 10, 0, 20, 7, 30, 0)
        assert base.down == () and base.values[5] == 0  # the base is left alone
        back = overlay(base, [(102, True, 20, 0)])
        assert back is not None and back.down == () and back.values == base.values

    def test_every_link_overlaid_is_the_links_themselves(self) -> None:
        """An agent from before NVLink deltas sends every link in a delta."""
        base = from_rows(b"k", rows(), 2)
        now = rows(down=(1, 3))
        view = overlay(base, now)
        assert view is not None and view == from_rows(b"", now, 2)

    def test_a_link_the_base_lacks_is_no_delta_of_it(self) -> None:
        assert overlay(from_rows(b"k", rows(), 2), [(9, False, 0, 0)]) is None

    def test_no_watched_counters(self) -> None:
        """With only the link-down rule there are no counters to keep."""
        base = from_rows(b"k", [(0, True), (1, True)], 0)
        view = overlay(base, [(1, False)])
        assert base.values == () and view is not None and view.down == (1,)
