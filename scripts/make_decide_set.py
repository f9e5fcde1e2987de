#!/usr/bin/env python3
"""The labeled decision set `bench/decide-quality` measures calibration on.

Writes `bench/decide-set/items.jsonl`: one decision per line, each with a
single question whose right answer is clear to a reader, from templates
over six families (fixed seed, so the file is reproducible):

- facts: yes/no statements about capitals, sums, animals and colours,
  half of them false;
- sentiment: customer reviews, positive / negative / neutral;
- routing: support messages to one of five intents;
- severity: incident reports on a low / medium / high / critical scale
  (a `score` question);
- next_action: an incident state and the action its rule calls for;
- incident: on-call alerts as in `examples/incident_policy`, page the team
  or not (yes/no) and whether customers are affected.

Each line: {"family", "state", "question": {"id", "kind", "question",
"options"}, "answer"}. Run from the repository root:
    python3 scripts/make_decide_set.py
"""

import json
import pathlib
import random

OUT = pathlib.Path(__file__).resolve().parent.parent / "bench/decide-set/items.jsonl"
rng = random.Random(20261202)

CAPITALS = [
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("Russia", "Moscow"), ("England", "London"), ("Egypt", "Cairo"), ("China", "Beijing"),
    ("Greece", "Athens"), ("Portugal", "Lisbon"), ("Austria", "Vienna"), ("Ireland", "Dublin"),
    ("Norway", "Oslo"), ("Poland", "Warsaw"), ("Canada", "Ottawa"), ("Kenya", "Nairobi"),
    ("Peru", "Lima"), ("Sweden", "Stockholm"), ("Thailand", "Bangkok"),
]
ANIMALS = ["dog", "cat", "horse", "cow", "lion", "sheep", "rabbit", "eagle", "shark", "frog"]
THINGS = ["chair", "spoon", "rock", "pencil", "table", "bottle", "carrot", "brick", "lamp", "cup"]
COLOURS = [("grass", "green", "purple"), ("snow", "white", "black"), ("the sky on a clear day", "blue", "red"),
           ("a ripe banana", "yellow", "blue"), ("coal", "black", "white"), ("blood", "red", "green")]


def facts():
    items = []
    yes_no = {"id": "true", "kind": "yes_no", "question": "Is the statement true?"}

    def add(statement, truth):
        items.append({"family": "facts", "state": f"Statement: {statement}", "question": yes_no,
                      "answer": "yes" if truth else "no"})

    for country, capital in CAPITALS:
        add(f"{capital} is the capital of {country}.", True)
        other = rng.choice([c for _, c in CAPITALS if c != capital])
        add(f"{other} is the capital of {country}.", False)
    for _ in range(20):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        add(f"{a} plus {b} equals {a + b}.", True)
        wrong = a + b + rng.choice([-3, -2, 2, 3, 5])
        add(f"{a} plus {b} equals {wrong}.", False)
    for animal, thing in zip(ANIMALS, THINGS):
        add(f"A {animal} is an animal.", True)
        add(f"A {thing} is an animal.", False)
    for what, right, wrong in COLOURS:
        add(f"The colour of {what} is {right}.", True)
        add(f"The colour of {what} is {wrong}.", False)
    return items


def sentiment():
    products = ["blender", "phone case", "backpack", "coffee maker", "desk lamp", "headset", "jacket", "kettle"]
    pos = ["I love this {p}. It works perfectly and I would buy it again.",
           "Excellent {p}! Great quality, fast delivery, very happy.",
           "The {p} is wonderful. Best purchase I made this year.",
           "Fantastic {p}, it exceeded my expectations. Highly recommended."]
    neg = ["The {p} broke after two days. Terrible quality, I want a refund.",
           "Awful {p}. It stopped working and support never answered.",
           "I hate this {p}. Cheap, flimsy and a waste of money.",
           "The worst {p} I have owned. It arrived damaged and does not work."]
    neu = ["The {p} arrived on Tuesday in a brown box.",
           "I received the {p}. It is the model listed on the page.",
           "The {p} comes in black and grey. I ordered the grey one.",
           "The {p} was delivered. I have not used it yet."]
    q = {"id": "sentiment", "kind": "choice", "question": "What is the sentiment of the review?",
         "options": ["positive", "negative", "neutral"]}
    items = []
    for p in products:
        for templates, label in ((pos, "positive"), (neg, "negative"), (neu, "neutral")):
            for t in rng.sample(templates, 3):
                items.append({"family": "sentiment", "state": "Review: " + t.format(p=p), "question": q,
                              "answer": label})
    return items


def routing():
    intents = {
        "billing": ["I was charged twice for my order last month. Please refund the extra payment.",
                    "My invoice shows the wrong amount. Why was my card charged 40 dollars?",
                    "Can you explain the fee on my last bill? I did not expect that charge.",
                    "The payment for my subscription was taken twice this month."],
        "technical_problem": ["The app crashes every time I open the settings page.",
                              "I get an error 500 when I upload a file. Nothing works.",
                              "The website does not load on my laptop, it shows a blank screen.",
                              "The sync feature stopped working after the last update."],
        "cancel_subscription": ["I want to cancel my subscription and close my account.",
                                "Please stop my membership. I do not want to renew it.",
                                "How do I end my plan? I would like to unsubscribe today.",
                                "Cancel my account, I am not using the service anymore."],
        "shipping": ["Where is my package? The tracking number has not changed in a week.",
                     "My order has not arrived yet. When will it be delivered?",
                     "The parcel was sent to the wrong address. Can you track it?",
                     "Delivery was supposed to be yesterday but the box never came."],
        "password_reset": ["I forgot my password and cannot log in.",
                           "The password reset email never arrives. I am locked out.",
                           "How do I change my password? I cannot sign in anymore.",
                           "My login fails, I need to reset my password."],
    }
    names = ["Ana", "Ben", "Chen", "Dana", "Eli", "Farah"]
    q = {"id": "intent", "kind": "choice", "question": "Which team should handle this message?",
         "options": list(intents)}
    items = []
    for intent, messages in intents.items():
        for m in messages:
            for name in rng.sample(names, 4):
                items.append({"family": "routing", "state": f"Message from {name}: {m}", "question": q,
                              "answer": intent})
    return items


def severity():
    services = ["checkout", "search", "login", "payments", "profile", "reports"]
    levels = {
        "critical": ["The whole {s} service is down for every user in all regions. Nothing works.",
                     "All {s} requests fail with errors. Customers everywhere are blocked and money is lost."],
        "high": ["About 30 percent of {s} requests fail for users in one region.",
                 "The {s} service is very slow and many customers complain, but it still works for most."],
        "medium": ["The {s} page loads a few seconds slower than usual for some users.",
                   "One internal dashboard of the {s} team shows stale data; customers are not affected."],
        "low": ["There is a typo in the help text of the {s} page.",
                "A log message of the {s} service has the wrong capitalisation."],
    }
    q = {"id": "severity", "kind": "score", "question": "How severe is this incident?",
         "options": ["low", "medium", "high", "critical"]}
    items = []
    for level, templates in levels.items():
        for t in templates:
            for s in rng.sample(services, 5):
                items.append({"family": "severity", "state": "Incident: " + t.format(s=s), "question": q,
                              "answer": level})
    return items


def next_action():
    cases = {
        "roll_back": ["Errors started right after the {t} deploy of the {s} service and keep rising.",
                      "The {s} release shipped at {t} broke logins; the previous version worked."],
        "add_disk_space": ["The disk of the {s} database is 99 percent full and writes start to fail at {t}.",
                           "At {t} the {s} server ran out of disk space; its volume is full."],
        "restart_service": ["The {s} process is stuck since {t}: it uses no CPU and answers no requests.",
                            "Since {t} the {s} worker hangs; a restart fixed the same hang last week."],
        "do_nothing": ["All {s} checks are green at {t}. Error rate and latency are normal.",
                       "The {s} dashboard at {t} shows healthy traffic and no errors."],
    }
    services = ["billing", "search", "auth", "inventory", "mail"]
    times = ["08:02", "11:40", "14:15", "19:30", "23:05"]
    q = {"id": "next_action", "kind": "choice", "question": "What should the on-call engineer do next?",
         "options": list(cases)}
    items = []
    for action, templates in cases.items():
        for t in templates:
            for s, tm in zip(rng.sample(services, 4), rng.sample(times, 4)):
                items.append({"family": "next_action", "state": t.format(s=s, t=tm), "question": q,
                              "answer": action})
    return items


def incident():
    page = {"id": "page_team", "kind": "yes_no", "question": "Should the on-call engineer be paged now?"}
    affected = {"id": "customers_affected", "kind": "yes_no", "question": "Are customers affected right now?"}
    bad = ["Alert {t}: {s}-api error rate {r}% for 10 minutes in all regions. Every request fails.",
           "Alert {t}: {s}-api is down. Customers cannot pay and support has {n} new tickets.",
           "Alert {t}: {s} returns HTTP 500 for {r}% of customer requests since the last deploy."]
    fine = ["Notice {t}: {s}-api latency rose by 3 ms for one minute and is back to normal.",
            "Notice {t}: a test alert for {s} fired during planned maintenance. No customer traffic.",
            "Notice {t}: the {s} disk is at 61% and grows 1% a week. No errors."]
    items = []
    for s in ["checkout", "payments", "login", "orders", "cart"]:
        t = f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}"
        for tpl in bad:
            state = tpl.format(t=t, s=s, r=rng.randint(40, 99), n=rng.randint(50, 400))
            items.append({"family": "incident", "state": state, "question": page, "answer": "yes"})
            items.append({"family": "incident", "state": state, "question": affected, "answer": "yes"})
        for tpl in fine:
            state = tpl.format(t=t, s=s)
            items.append({"family": "incident", "state": state, "question": page, "answer": "no"})
            items.append({"family": "incident", "state": state, "question": affected, "answer": "no"})
    return items


def main():
    items = facts() + sentiment() + routing() + severity() + next_action() + incident()
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w") as f:
        for it in items:
            f.write(json.dumps(it) + "\n")
    by = {}
    for it in items:
        by[it["family"]] = by.get(it["family"], 0) + 1
    print(f"{OUT}: {len(items)} items: " + ", ".join(f"{k} {v}" for k, v in by.items()))


if __name__ == "__main__":
    main()
