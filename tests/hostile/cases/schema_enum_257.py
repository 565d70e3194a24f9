"""An enum of 257 values (a 500 'more than 256 parse stacks' before #62): served."""
import json

EXPECT = 200


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    schema = {"enum": ["value-%d" % i for i in range(257)]}
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "e", "schema": schema}}

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
