"""Ollama's API, messages an object, not an array: a 400 in Ollama's format ({"error": "..."}) naming messages."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": {"role": "user"}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "messages" not in answer["error"]:
        return "not Ollama's error naming messages: %s" % answer
    return None
