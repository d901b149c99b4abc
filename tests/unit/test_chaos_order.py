"""The chaos run's audit: a key's messages first reach each destination in send (id) order; what it shows."""

from __future__ import annotations

from tests.chaos.run import _detail, keys_out_of_order

KEYS = {1: "a", 2: "b", 3: "a", 4: "a", 5: None, 6: "b"}


def test_first_arrivals_in_id_order_pass_and_duplicates_do_not_count():
    # 1 arrives again after 3 and 4 (an attempt that did not end cleanly): a duplicate, not a reordering
    assert keys_out_of_order({"handler": [1, 2, 3, 1, 4, 6, 5], "broker": []}, KEYS) == 0


def test_a_later_message_first_arriving_before_an_earlier_one_is_caught():
    assert keys_out_of_order({"handler": [1, 4, 3, 2, 6], "broker": []}, KEYS) == 1


def test_each_destination_is_read_on_its_own():
    # key a split between the handler (1, 4) and the broker (3): each in order where it arrived
    assert keys_out_of_order({"handler": [1, 4], "broker": [3, 2, 6]}, KEYS) == 0
    assert keys_out_of_order({"handler": [1, 4], "broker": [6, 2]}, KEYS) == 1


def test_an_unexplained_duplicate_is_shown_with_where_its_copies_are_and_every_attempt_of_its_message():
    detail = _detail(
        7,
        [(0, 2, 41), (1, 2, 3)],
        {
            1: [("failed", "Traceback ...\nKafkaDeliveryError: acknowledged without an offset\n")],
            2: [("delivered", "")],
        },
    )
    assert detail == (
        "message 7: received [(0, 2, 41), (1, 2, 3)]; attempts "
        "#1 failed 'KafkaDeliveryError: acknowledged without an offset'; #2 delivered"
    )
    assert _detail(8, [None, None], {}) == "message 8: received [None, None]; attempts none"
