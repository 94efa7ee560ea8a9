"""Content-Length framing: partial reads, several messages at once, and every kind of bad input."""

import json

from dap_server.protocol import FramingError, MessageReader, encode


def frame(message: dict) -> bytes:
    return encode(message)


def request(seq: int, command: str = "threads") -> dict:
    return {"seq": seq, "type": "request", "command": command}


def test_message_split_into_single_bytes_is_reassembled():
    reader = MessageReader()
    out = []
    for byte in frame(request(1)):
        out += reader.feed(bytes([byte]))
    assert out == [request(1)]


def test_several_messages_in_one_read_come_out_in_order():
    reader = MessageReader()
    assert reader.feed(frame(request(1)) + frame(request(2)) + frame(request(3))[:10]) == [request(1), request(2)]
    assert reader.feed(frame(request(3))[10:]) == [request(3)]


def test_missing_content_length_is_reported_and_the_next_message_is_read():
    reader = MessageReader()
    body = json.dumps(request(1)).encode()
    out = reader.feed(b"Content-Type: json\r\n\r\n" + body + frame(request(2)))
    assert isinstance(out[0], FramingError) and "without Content-Length" in out[0].message
    assert out[1:] == [request(2)]


def test_malformed_content_length_is_reported():
    reader = MessageReader()
    out = reader.feed(b"Content-Length: ten\r\n\r\n" + frame(request(2)))
    assert "malformed Content-Length" in out[0].message
    assert out[-1] == request(2)


def test_invalid_json_and_non_objects_are_reported():
    reader = MessageReader()
    out = reader.feed(b"Content-Length: 5\r\n\r\n{oops" + b"Content-Length: 2\r\n\r\n[]" + frame(request(3)))
    assert "invalid JSON" in out[0].message
    assert "JSON object" in out[1].message
    assert out[2] == request(3)


def test_a_request_without_command_keeps_its_seq_so_it_can_be_answered():
    (error,) = MessageReader().feed(frame({"seq": 7, "type": "request"}))
    assert isinstance(error, FramingError) and error.seq == 7


def test_oversized_message_is_skipped_without_being_buffered():
    reader = MessageReader(max_bytes=1000)
    out = reader.feed(b"Content-Length: 5000\r\n\r\n")
    assert "exceeds" in out[0].message
    for _ in range(5):
        assert reader.feed(b"x" * 1000) == []
        assert len(reader._buffer) == 0  # skipped as it arrives, never held
    assert reader.feed(frame(request(9))) == [request(9)]


def test_junk_without_a_header_is_discarded_once_and_framing_resumes():
    reader = MessageReader()
    out = reader.feed(b"garbage " * 2000 + frame(request(4)))
    errors = [o for o in out if isinstance(o, FramingError)]
    assert len(errors) == 1 and "discarded" in errors[0].message
    assert out[-1] == request(4)


def test_nan_and_infinity_are_sent_as_strings():
    framed = encode({"seq": 1, "min": float("nan"), "max": float("inf"), "x": [float("-inf")]})
    body = json.loads(framed.split(b"\r\n\r\n")[1])
    assert body == {"seq": 1, "min": "nan", "max": "inf", "x": ["-inf"]}


def test_a_body_shorter_than_its_content_length_gives_way_to_the_next_header():
    reader = MessageReader()
    out = reader.feed(b'Content-Length: 100\r\n\r\n{"seq": 2' + frame(request(3)) + frame(request(4)))
    assert "ended before the 100 bytes" in out[0].message
    assert out[1:] == [request(3), request(4)]


def test_a_content_length_no_client_will_ever_send_does_not_swallow_the_stream():
    reader = MessageReader()
    out = reader.feed(b"Content-Length: 99999999999\r\n\r\nabc" + frame(request(5)))
    assert "exceeds the 16 MiB limit" in out[0].message and "ended before" in out[1].message
    assert out[2:] == [request(5)]


def test_a_content_length_of_thousands_of_digits_is_refused():
    out = MessageReader().feed(b"Content-Length: " + b"9" * 5000 + b"\r\n\r\n" + frame(request(6)))
    assert "5000 digits" in out[0].message and out[-1] == request(6)


def test_deep_nesting_is_refused_before_parsing_and_keeps_the_seq():
    body = b'{"seq": 8, "type": "request", "command": "threads", "arguments": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    (error,) = MessageReader().feed(b"Content-Length: %d\r\n\r\n" % len(body) + body)
    assert "nested more than 64 levels" in error.message and (error.seq, error.command) == (8, "threads")


def test_brackets_inside_strings_do_not_count_as_nesting():
    message = {**request(9), "arguments": {"expression": "[" * 500}}
    assert MessageReader().feed(frame(message)) == [message]
