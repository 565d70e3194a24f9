# A wrong key.
KEY = True
EXPECT = 401


def request():
    return ("POST", "/v1/chat/completions", {"Authorization": "Bearer sk-guess", "Content-Type": "application/json"},
            b'{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}')
