"""anyOf of 300 objects that all start alike: too ambiguous to follow, a 400 at parse time (a 500 at submit before #62)."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"anyOf": [{"type": "object", "properties": {"k%d" % i: {"type": "integer"}}, "required": ["k%d" % i]} for i in range(300)]}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
