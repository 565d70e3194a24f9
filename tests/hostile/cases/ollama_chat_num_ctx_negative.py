"""Ollama's API, options.num_ctx negative: a 400 in Ollama's format ({"error": "..."}) naming num_ctx."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "options": {"num_ctx": -4096}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "num_ctx" not in answer["error"]:
        return "not Ollama's error naming num_ctx: %s" % answer
    return None
