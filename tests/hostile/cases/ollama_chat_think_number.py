"""Ollama's API, think a number: a 400 in Ollama's format ({"error": "..."}) naming think."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [], "think": 1}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "think" not in answer["error"]:
        return "not Ollama's error naming think: %s" % answer
    return None
