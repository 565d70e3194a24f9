"""A client that sends a schema of 20,000 properties (a second of compiling, or more) and hangs up
0.2 s later: the server stops compiling it."""
import json

HANG_UP = 0.2


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"type": "object", "properties": {"gone_%d" % i: {"type": "string"} for i in range(20000)}}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "w", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
