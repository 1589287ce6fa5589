"""How the credit window is shared among links topping up together (haqueue/broker/receive_credit.py): counted in
top-ups, so the share is the same however slowly a loaded machine lets the publishers go."""
from __future__ import annotations

from haqueue.broker.receive_credit import RECEIVE_WINDOW, RECENT_TOP_UPS, SHARED_MIN, ReceiveShare


def test_a_lone_link_gets_the_whole_window():
    share = ReceiveShare()
    assert [share.window(1) for _ in range(3)] == [RECEIVE_WINDOW] * 3


def test_ten_links_topping_up_in_bursts_get_a_tenth_each():
    share = ReceiveShare()
    for link in range(10):  # each client burst tops its link up a few times in a row
        for _ in range(3):
            share.window(link)
    assert {share.window(link) for link in range(10)} == {RECEIVE_WINDOW // 10}


def test_links_that_stopped_drop_out_and_a_link_gone_counts_no_more():
    share = ReceiveShare()
    for link in range(30):
        share.window(link)
    assert share.window(0) == SHARED_MIN  # more links than the window has room for: each its least
    windows = [share.window(0) for _ in range(RECENT_TOP_UPS)]
    assert windows[-1] == RECEIVE_WINDOW  # the others stopped topping up: link 0 alone again
    share.window(1)
    assert share.window(0) == RECEIVE_WINDOW // 2
    share.forget(1)
    assert share.window(0) == RECEIVE_WINDOW


def test_a_link_gone_and_its_address_taken_again_is_counted_once():
    share = ReceiveShare()
    for _ in range(RECENT_TOP_UPS):
        share.window(7)
    share.forget(7)  # the link closed; a new link gets its address and tops up past the old one's top-ups
    assert [share.window(7) for _ in range(2 * RECENT_TOP_UPS)] == [RECEIVE_WINDOW] * (2 * RECENT_TOP_UPS)
    share.window(8)
    assert share.window(7) == RECEIVE_WINDOW // 2
