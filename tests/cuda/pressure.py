"""Memory pressure (tests/cuda/pressure.sh): CLIENTS clients, each with two long conversations of
its own, all sending at once to a server whose KV cache holds only a few of them. Every answer must
equal the one the same request got alone (taken first, one request at a time), except where the two
part at a near-tie: at the first token where they differ, the two best tokens' log-probabilities of
either answer lie within TIE, a gap in log-probability (each of the two logits can move by the
kernels' stated error bound for the model's types, which tests/cuda/run.sh states relative to a
row's largest logit). Every request must succeed (no 5xx, no dropped connection), the engine
must be idle afterwards, and the load must have recomputed prompts the cache could not keep (else
there was no pressure to test). Python's standard library only: it runs where Node.js is not.

    python3 pressure.py BASE_URL MODEL API_KEY [CLIENTS=32] [DOC_WORDS=7900] [TURNS=2] [TIE=0.05]
"""
import json
import re
import sys
import threading
import urllib.error
import urllib.request

base, model, key = sys.argv[1:4]
clients = int(sys.argv[4]) if len(sys.argv) > 4 else 32
doc_words = int(sys.argv[5]) if len(sys.argv) > 5 else 7900
turns = int(sys.argv[6]) if len(sys.argv) > 6 else 2
TIE = float(sys.argv[7]) if len(sys.argv) > 7 else 0.05
ANSWER_TOKENS = 12
WORDS = ("time year people way day man thing woman life child world school state family student group "
         "country problem hand part place case week company system program question work government number "
         "night point home water room mother area money story fact month lot right study book eye job word "
         "business issue side kind head house service friend father power hour game line end member law car "
         "city community name").split()


def document(client, conversation):
    """A conversation's document: a header naming it, then words drawn by a seeded generator."""
    seed = (client * 1000003 + conversation * 7919 + 17) & 0xFFFFFFFF
    out = [f"Conversation {client}-{conversation}. Read this record and answer the questions after it."]
    for _ in range(doc_words):
        seed = (seed * 1664525 + 1013904223) & 0xFFFFFFFF
        out.append(WORDS[(seed >> 16) % len(WORDS)])  # the high bits: the low ones cycle fast
    return " ".join(out)


def messages_of(client, conversation, turn, answers):
    """Turn `turn`: the document with the first question, then each earlier answer and the next question."""
    question = lambda k: f"Question {k + 1}: which words come up most?"
    m = [{"role": "user", "content": f"{document(client, conversation)}\n\n{question(0)}"}]
    for k in range(1, turn + 1):
        m += [{"role": "assistant", "content": answers[k - 1]["text"]}, {"role": "user", "content": question(k)}]
    return m


def ask(messages):
    body = json.dumps({"model": model, "messages": messages, "max_tokens": ANSWER_TOKENS, "temperature": 0,
                       "ignore_eos": True, "logprobs": True, "top_logprobs": 2}).encode()
    req = urllib.request.Request(f"{base}/v1/chat/completions", body, {
        "authorization": f"Bearer {key}", "content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as res:
            answer = json.load(res)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"HTTP {e.code}: {e.read()[:300]!r}") from None
    choice, usage = answer["choices"][0], answer["usage"]
    return {"text": choice["message"]["content"], "tokens": choice["logprobs"]["content"],
            "prompt": usage["prompt_tokens"],
            "cached": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


def same_or_tie(a, b):
    """('same' | 'a near-tie ...' | 'parted ...', True when the answers count as equal)."""
    n = min(len(a["tokens"]), len(b["tokens"]))
    i = 0
    while i < n and a["tokens"][i]["token"] == b["tokens"][i]["token"]:
        i += 1
    if i == n and len(a["tokens"]) == len(b["tokens"]):
        return "same", True
    def gap(t):
        top = t["top_logprobs"] if t else []
        return top[0]["logprob"] - top[1]["logprob"] if len(top) > 1 else float("inf")
    at = lambda x: x["tokens"][i] if i < len(x["tokens"]) else None
    g = min(gap(at(a)), gap(at(b)))
    return (f"a near-tie at token {i} (top-2 gap {g:.4f})", True) if g <= TIE else (
        f"parted at token {i}, top-2 gap {g:.4f} > {TIE}", False)


# The references, one request at a time; each conversation's answers feed its later turns.
reference = []
for c in range(clients):
    convs = []
    for k in range(2):
        answers = []
        for t in range(turns):
            answers.append(ask(messages_of(c, k, t, answers)))
        convs.append(answers)
    reference.append(convs)

# The load: every client alternates between its two conversations, turn by turn, all at once.
count = {"same": 0, "ties": 0, "wrong": 0, "failed": 0, "prompt": 0, "cached": 0}
lock = threading.Lock()


def client(c):
    for t in range(turns):
        for k in range(2):
            want = reference[c][k][t]
            try:
                got = ask(messages_of(c, k, t, reference[c][k]))
            except Exception as e:  # noqa: BLE001 - every failure is counted and shown
                with lock:
                    count["failed"] += 1
                    print(f"client {c} conversation {k} turn {t}: {e}")
                continue
            verdict, equal = same_or_tie(got, want)
            with lock:
                count["prompt"] += got["prompt"]
                count["cached"] += got["cached"]
                if verdict == "same":
                    count["same"] += 1
                elif equal:
                    count["ties"] += 1
                    print(f"client {c} conversation {k} turn {t}: {verdict}")
                else:
                    count["wrong"] += 1
                    print(f"client {c} conversation {k} turn {t}: {verdict}: "
                          f"got {got['text']!r}, alone {want['text']!r}")


threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
for th in threads:
    th.start()
for th in threads:
    th.join()

with urllib.request.urlopen(f"{base}/metrics", timeout=60) as res:
    metrics = res.read().decode()
gauge = lambda name: int(re.search(rf"^{name} (\d+)$", metrics, re.M).group(1))
running, queued = gauge("ember_running_sequences"), gauge("ember_queue_length")
print(f"{clients} clients x 2 conversations x {turns} turns: {count['same']} the same as alone, {count['ties']} "
      f"parted at a near-tie, {count['wrong']} wrong, {count['failed']} failed; preemptions "
      f"{gauge('ember_preemptions_total')}, afterwards running {running}, queued {queued}; prompt tokens "
      f"{count['prompt']}, {count['cached']} of them from the cache")
checks = [("every request answered, as alone or parting at a near-tie", count["failed"] == 0 and count["wrong"] == 0),
          ("the engine idle afterwards", running == 0 and queued == 0),
          # had the cache kept every conversation, the load would have recomputed nothing
          ("the load ran under memory pressure", count["cached"] < count["prompt"] * 0.9)]
for name, ok in checks:
    print(f"{'ok  ' if ok else 'FAIL'} {name}")
sys.exit(0 if all(ok for _, ok in checks) else 1)
