"""A pattern of 100 nested groups in a tool's parameters (short enough for the prompt of a small model), with the call forced: a 400."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    parameters = {"type": "object", "properties": {"s": {"type": "string", "pattern": "(" * 100 + "a" + ")" * 100}}}
    body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": parameters}}]
    body["tool_choice"] = "required"

    return ("POST", "/v1/chat/completions", {"Content-Type": "application/json"}, json.dumps(body).encode())
