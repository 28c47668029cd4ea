"""Writes prompts/autotune-prompts.jsonl: the shipped text prompts (CC0, written for autotune).

Each prompt is a task template filled with a subject; some carry a short passage written here, to be
summarized, translated into plain words or checked, so prompt lengths range from a line to a few hundred
words. `output_len` is the answer length a user of that task would ask for. Deterministic: run it again and
the file is the same.

    python scripts/make_prompts.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "prompts" / "autotune-prompts.jsonl"

SUBJECTS = [
    "how a refrigerator moves heat out of its box",
    "why the sky is blue in the day and red at sunset",
    "how a hash table finds a key",
    "what a mortgage's interest rate changes over thirty years",
    "how vaccines teach the immune system",
    "why bread rises",
    "how a bicycle stays upright",
    "what a database index costs on writes",
    "how tides follow the moon",
    "why cats purr",
    "how a compiler turns source code into machine code",
    "what inflation does to savings",
    "how noise-cancelling headphones work",
    "why leaves change colour in autumn",
    "how a search engine ranks pages",
    "what makes a good password",
    "how the heart pumps blood",
    "why planes can fly upside down",
    "how a battery stores energy",
    "what a load balancer does",
    "how coffee is decaffeinated",
    "why the ocean is salty",
    "how garbage collection frees memory",
    "what causes thunder",
    "how a transformer model reads a sentence",
    "why we have leap years",
    "how solar panels make electricity",
    "what a bond's yield means",
    "how bees make honey",
    "how a GPU runs thousands of threads",
]

TEMPLATES = [
    ("Explain {s} to a curious twelve-year-old, in plain words and with one everyday example.", 256),
    ("Write a short, friendly paragraph that explains {s}.", 160),
    ("I am studying for an exam. Give me five key points about {s}, each in one sentence.", 200),
    ("What are the most common misconceptions about {s}? List three and correct each one.", 320),
    ("Write a haiku about {s}.", 48),
    ("Compare two ways people usually describe {s}, and say which one is more accurate and why.", 384),
    ("Give a step by step explanation of {s}. Number the steps.", 320),
    ("In one sentence: {s}?", 64),
    ("Write a dialogue between a teacher and a student about {s}. Keep it under ten lines.", 256),
    ("Summarize what an expert would want a beginner to know about {s}.", 256),
    ("Write a quiz of four multiple-choice questions about {s}, with the answers at the end.", 400),
    ("Explain {s} as if you were writing the opening of an encyclopedia article.", 300),
]

PASSAGES = [
    "The village sat at the bend of the river, where the water slowed and the fishermen kept their boats. "
    "Every spring the river rose, and every spring the village moved its boats up the bank, and every spring "
    "the older fishermen told the younger ones that the river had been higher once. Nobody remembered when. "
    "The mill by the bridge had a mark on its wall, a line of white paint, and the children liked to stand "
    "beside it and reach up to touch it. The line was above their heads. The miller said his grandfather had "
    "painted it the year the water came into the mill, the year the bridge went, the year the village moved "
    "its boats to the top of the hill.",
    "To reset the router, first unplug it from the wall. Wait thirty seconds. While the router is unplugged, "
    "check that the cable from the wall socket is firmly in the port marked WAN. Plug the router back in and "
    "wait until the power light is steady. If the power light is steady but the internet light is off, press "
    "and hold the reset button for ten seconds. The router will restart with its factory settings. After the "
    "restart, connect to the network named on the label on the bottom of the router, using the password on "
    "the same label. If the internet light is still off, call your provider and tell them the router has been "
    "reset.",
    "Meeting notes. Attendees: the platform team and the data team. The platform team reported that the new "
    "build system cut the build time from forty minutes to twelve minutes. The data team asked whether the "
    "new build system could also build the data pipelines. The platform team said yes, but the data pipelines "
    "would need their tests moved first. Action: the data team moves the pipeline tests by the end of the "
    "month. Action: the platform team writes a short guide to the new build system. The next meeting is in "
    "two weeks, and the data team will report on the pipeline tests then.",
    "def merge(left, right):\n    result = []\n    i = j = 0\n    while i < len(left) and j < len(right):\n"
    "        if left[i] <= right[j]:\n            result.append(left[i])\n            i += 1\n        else:\n"
    "            result.append(right[j])\n            j += 1\n    result.extend(left[i:])\n"
    "    result.extend(right[j:])\n    return result\n\n\ndef merge_sort(items):\n    if len(items) <= 1:\n"
    "        return items\n    middle = len(items) // 2\n"
    "    return merge(merge_sort(items[:middle]), merge_sort(items[middle:]))\n",
    "Dear customer, thank you for your order. Your order has been shipped and should arrive within five "
    "working days. If your order has not arrived within five working days, please reply to this email with "
    "your order number. Please note that orders shipped to islands may take two more working days. If any "
    "item in your order is damaged, keep the packaging and send us a photo of the item and the packaging. "
    "We will send a replacement item at no cost. Thank you again for your order.",
    "The committee considered three sites for the new library. The first site, by the station, is easy to "
    "reach by train but small. The second site, the old school, is large but needs a new roof. The third "
    "site, on the edge of the park, is large and needs no work, but it is a long walk from the station and "
    "from the school. The committee asked the council to compare the cost of the roof at the old school with "
    "the cost of a bus from the station to the park.",
]

PASSAGE_TASKS = [
    ("Summarize the following text in two sentences.\n\n{p}", 96),
    ("Read the text below and list every fact it states, one per line.\n\n{p}", 256),
    ("Rewrite the following in simpler words, keeping every detail.\n\n{p}", 320),
    ("What questions would a careful reader ask after reading this? Give three.\n\n{p}", 160),
    ("Translate the following into formal English, as for a report.\n\n{p}", 320),
    ("Find anything unclear or wrong in the following and suggest a fix for each.\n\n{p}", 384),
]


def main() -> None:
    rng = random.Random(22)
    rows = [{"text": t.format(s=s), "output_len": n} for s in SUBJECTS for t, n in rng.sample(TEMPLATES, 5)]
    rows += [{"text": t.format(p=p), "output_len": n} for p in PASSAGES for t, n in PASSAGE_TASKS]
    rng.shuffle(rows)
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    print(f"wrote {len(rows)} prompts to {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
