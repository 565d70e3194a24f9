"""Ollama's API, keep_alive an object: a 400 in Ollama's format ({"error": "..."}) naming keep_alive."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [], "keep_alive": {}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "keep_alive" not in answer["error"]:
        return "not Ollama's error naming keep_alive: %s" % answer
    return None
