"""Ollama's API, options a string: a 400 in Ollama's format ({"error": "..."}) naming options."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [], "options": "fast"}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "options" not in answer["error"]:
        return "not Ollama's error naming options: %s" % answer
    return None
