"""anyOf of 300 consts (a 500 at submit before #62): one choice of literals, served."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"anyOf": [{"const": "c%d" % i} for i in range(300)]}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
