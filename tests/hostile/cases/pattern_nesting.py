"""A JSON-schema pattern of 30,000 nested groups in response_format (issue #62: crashed the server in pattern.c): a 400 naming the 64-level limit."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"type": "string", "pattern": "^" + "(" * 30000 + "a" + ")" * 30000 + "$"}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
