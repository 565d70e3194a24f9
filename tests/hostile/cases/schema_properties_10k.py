"""A schema of 10,000 optional properties (23 s of compile before #62): served, or refused by the
compile-time limit (a slower build), within 2 s of the server's CPU, while other clients are answered."""
import json

EXPECT = (200, 400)
CPU_LIMIT = 2.0
ALONGSIDE = True


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"type": "object", "properties": {"property_%d" % i: {"type": "string"} for i in range(10000)}}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
