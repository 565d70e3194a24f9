"""Ollama's API, options.seed a fraction: a 400 in Ollama's format ({"error": "..."}) naming seed."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "options": {"seed": 1.5}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "seed" not in answer["error"]:
        return "not Ollama's error naming seed: %s" % answer
    return None
