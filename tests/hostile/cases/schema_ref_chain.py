"""A chain of 20,000 $refs (issue #62: crashed the server in schema.c): each becomes a rule, served."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    defs = {"d%d" % i: {"$ref": "#/$defs/d%d" % (i + 1)} for i in range(20000)}
    defs["d20000"] = {"type": "integer"}
    schema = {"$ref": "#/$defs/d0", "$defs": defs}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
