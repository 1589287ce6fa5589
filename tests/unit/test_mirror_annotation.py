"""The source seq a mirrored message carries (haqueue/mirror/annotation.py): added to whatever message
annotations the message has, replacing one from an earlier mirror, every other section kept as it was."""
from __future__ import annotations

from proton import Message

from haqueue.mirror.annotation import seq_of, with_seq

SEQ = (3 << 40) + 7  # a seq of epoch 3


def annotated(message: Message, seq: int) -> Message:
    out = Message()
    out.decode(with_seq(bytes(message.encode()), seq))
    return out


def test_a_message_without_annotations_gets_them_and_keeps_the_rest() -> None:
    message = Message(body=[1, "two", None], durable=True, ttl=5, priority=7, id="m-1", subject="s",
                      properties={"p": "q"}, instructions={"d": 1})
    out = annotated(message, SEQ)
    assert out.annotations == {"x-opt-mirror-seq": SEQ}
    assert (out.body, out.durable, out.ttl, out.priority, out.id, out.subject, out.properties, out.instructions) == \
        (message.body, True, 5.0, 7, "m-1", "s", {"p": "q"}, {"d": 1})


def test_existing_annotations_are_kept_and_an_earlier_seq_replaced() -> None:
    out = annotated(Message(body=b"x" * 300, annotations={"a": 1, "x-opt-mirror-seq": 5, "b": "c"}), SEQ)
    assert out.annotations == {"x-opt-mirror-seq": SEQ, "a": 1, "b": "c"} and out.body == b"x" * 300
    assert seq_of(with_seq(bytes(out.encode()), 9)) == 9


def test_a_message_of_no_mirror_has_no_seq() -> None:
    assert seq_of(bytes(Message(body="x", annotations={"a": 1}).encode())) is None


def test_a_map8_of_annotations_as_other_clients_write_it() -> None:
    """proton writes map32; rhea writes a small map as map8 (size and count in a byte each)."""
    data = bytes.fromhex("005372" "c10602" "a30161" "5401") + bytes.fromhex("005377" "a10178")  # {a: 1}, body "x"
    out = Message()
    out.decode(with_seq(data, SEQ))
    assert out.annotations == {"x-opt-mirror-seq": SEQ, "a": 1} and out.body == "x"
