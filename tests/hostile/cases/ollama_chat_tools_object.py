"""Ollama's API, tools an object: a 400 in Ollama's format ({"error": "..."}) naming tools."""
import json

EXPECT = 400


def request():
    body = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "tools": {"type": "function"}}
    return ("POST", "/api/chat", {"Content-Type": "application/json"}, json.dumps(body).encode())


def check(body):
    answer = json.loads(body)
    if list(answer) != ["error"] or "tools" not in answer["error"]:
        return "not Ollama's error naming tools: %s" % answer
    return None
