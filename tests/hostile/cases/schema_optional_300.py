"""An object of 300 optional properties (a 500 at submit before #62): served."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"type": "object", "properties": {"p%d" % i: {"type": "integer"} for i in range(300)}, "additionalProperties": False}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
