"""A schema that is only a $ref to itself: a 400."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#"}}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
