"""Generate prompts/prod.jsonl, the sample corpus shipped with the planner, and
prompts/chat-sessions.jsonl, its multi-turn chat sessions.

    python prompts/make_prod.py                  # writes prompts/prod.jsonl
    python prompts/make_prod.py --out DIR/x.jsonl
    python prompts/make_prod.py --sessions 120   # writes prompts/chat-sessions.jsonl

Deterministic: the same seed and count give the same bytes on every machine and Python >= 3.11
(only `random.Random` with a fixed seed, no hash-ordered iteration, no clock). Standard library
only, nothing downloaded.

The mix imitates a production assistant's traffic: short multi-turn chat, questions over
retrieved passages (RAG), summaries of long documents, and code help in several languages.
Input lengths are lognormal per category, so the whole has a long tail (median a few hundred
tokens, p99 a few thousand); requested output lengths (max_tokens) are lognormal too. Every
request keeps prompt + max_tokens <= MAX_TOTAL_TOKENS by the estimate below, so the corpus runs
against a server with max_model_len 4096. Arrivals (timestamp_s) are a Poisson process.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import tempfile
from pathlib import Path

SEED = 20240611
COUNT = 600
RATE_PER_S = 5.0
MAX_TOTAL_TOKENS = 4000
# Inputs stop growing here so a request's text plus its one overshooting sentence stays in budget.
MAX_INPUT_TOKENS = 3500
MIN_MAX_TOKENS = 16

# The same rule as replay/corpus/lengths.py (a unit test checks this file's output against that module);
# repeated here so the script runs with nothing but the standard library.
BYTES_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / BYTES_PER_TOKEN)


# category -> (share of requests, input median tokens, input sigma, max_tokens median, max_tokens sigma)
CATEGORIES: dict[str, tuple[float, float, float, float, float]] = {
    "chat": (0.40, 110.0, 0.85, 170.0, 0.85),
    "rag": (0.25, 900.0, 0.55, 140.0, 0.65),
    "summarization": (0.15, 1400.0, 0.50, 260.0, 0.55),
    "code": (0.20, 380.0, 0.85, 320.0, 0.85),
}
# Share of requests sent in the chat (messages) form, per category; chat is always messages.
MESSAGES_SHARE = {"chat": 1.0, "rag": 0.3, "summarization": 0.25, "code": 0.5}

# ---------------------------------------------------------------------------------------------
# Prose: domain vocabularies poured into sentence templates.

DOMAINS: list[dict[str, list[str]]] = [
    {
        "org": ["the platform team", "Northwind Hosting", "the SRE group", "the infrastructure council"],
        "person": ["Priya Raman, the on-call lead", "Tomás Ortega from networking", "Dana Whitfield, the CTO",
                   "Kenji Watanabe, a staff engineer"],
        "thing": ["the ingest cluster", "the billing service", "the object store", "the internal DNS",
                  "the deploy pipeline", "the message queue"],
        "metric": ["p99 latency", "the error rate", "monthly compute spend", "mean time to recovery",
                   "disk utilisation", "the page volume"],
        "event": ["the March outage", "the move to the new region", "the certificate rotation",
                  "the Black Friday peak", "the Kubernetes upgrade"],
        "cause": ["a misconfigured load balancer", "a retry storm from one client", "an expired certificate",
                  "noisy neighbours on shared hosts", "an unbounded cache"],
        "action": ["roll back the release", "add a second replica in every zone", "cap retries at three",
                   "move the batch jobs to night hours", "rewrite the runbook"],
        "outcome": ["customers saw far fewer timeouts", "the pager went quiet for a month",
                    "spend fell without any loss of headroom", "recovery took minutes instead of hours"],
        "place": ["eu-west", "the Frankfurt region", "the Virginia data centre", "ap-southeast"],
    },
    {
        "org": ["Harbor & Pine Outfitters", "the e-commerce team", "the merchandising department",
                "a regional grocery chain"],
        "person": ["Lena Fischer, head of merchandising", "Marcus Bell, the supply planner",
                   "Aisha Karim from customer care", "José Álvarez, the store operations manager"],
        "thing": ["the checkout flow", "the loyalty programme", "the returns desk", "the spring catalogue",
                  "the recommendation widget", "the warehouse in Leeds"],
        "metric": ["the conversion rate", "the average basket size", "the return rate", "stock-outs",
                   "customer satisfaction scores", "delivery times"],
        "event": ["the holiday sale", "the switch to a new payment provider", "the redesign of the product pages",
                  "the launch of same-day delivery", "the price increase in April"],
        "cause": ["a confusing shipping form", "late deliveries from one supplier", "sizing charts that ran small",
                  "a bug that emptied carts on mobile", "aggressive discounting by a competitor"],
        "action": ["simplify the checkout to two steps", "offer free returns for loyalty members",
                   "reorder stock weekly instead of monthly", "publish clearer size guides",
                   "pause the discount codes"],
        "outcome": ["basket sizes grew steadily", "returns fell to their lowest level in two years",
                    "complaints about delivery almost disappeared", "the margin recovered by the summer"],
        "place": ["the Manchester stores", "the online shop", "the Dublin flagship", "the outlet centres"],
    },
    {
        "org": ["Riverside Community Clinic", "the county health board", "the nursing staff",
                "a network of rural practices"],
        "person": ["Dr. Amara Osei, the medical director", "Nurse Helen Brooks", "Samuel Greene, the practice manager",
                   "Dr. Łukasz Nowak, a visiting cardiologist"],
        "thing": ["the appointment system", "the vaccination drive", "the after-hours phone line",
                  "the patient portal", "the diabetes programme", "the triage desk"],
        "metric": ["waiting times", "no-show rates", "readmissions within thirty days", "staff overtime",
                   "patient satisfaction", "the number of missed follow-ups"],
        "event": ["the winter flu season", "the move to electronic records", "the opening of the second site",
                  "the staffing shortage in autumn", "the new referral guidelines"],
        "cause": ["reminder texts that were never sent", "a shortage of night-shift nurses",
                  "a referral form that confused patients", "long phone queues in the morning",
                  "duplicate records in the old system"],
        "action": ["send reminders two days before each visit", "open an evening clinic twice a week",
                   "train the front desk on the new portal", "hire two more nurse practitioners",
                   "merge the duplicate records"],
        "outcome": ["waiting times dropped by almost a third", "more patients kept their follow-up visits",
                    "overtime fell for the first time in a year", "the phone queue shrank noticeably"],
        "place": ["the north clinic", "the main hospital", "the mobile unit", "the Kraków partner site"],
    },
    {
        "org": ["the city transport authority", "Metro Link", "the cycling coalition", "the regional rail operator"],
        "person": ["Councillor Ruth Adeyemi", "Oliver Stein, the network planner", "Mei Lin, a traffic engineer",
                   "Zoë Martin from the riders' association"],
        "thing": ["the number 12 bus route", "the new tram line", "the bike-share scheme", "the park-and-ride",
                  "the night buses", "the ticketing app"],
        "metric": ["ridership", "on-time performance", "average journey time", "fare revenue",
                   "the number of cyclists", "peak-hour crowding"],
        "event": ["the fare freeze", "the bridge closure", "the opening of the tram extension",
                  "the timetable change in September", "the heatwave in July"],
        "cause": ["roadworks on the ring road", "a shortage of drivers", "signal failures near the central station",
                  "a confusing new timetable", "parking that was cheaper than the bus"],
        "action": ["add bus lanes on the main corridor", "run trams every six minutes at peak",
                   "extend the bike lanes to the university", "integrate tickets across bus and rail",
                   "publish live arrival times"],
        "outcome": ["ridership returned to pre-pandemic levels", "journeys became more predictable",
                    "cycling to work nearly doubled", "complaints about crowding fell"],
        "place": ["the east side", "the city centre", "the suburbs", "the airport corridor"],
    },
    {
        "org": ["Greenfield Energy", "the solar co-operative", "the grid operator", "a wind developer"],
        "person": ["Ingrid Solberg, the project lead", "Rahul Mehta, a grid analyst", "Claire Dubois from finance",
                   "Ahmed Hassan, the site engineer"],
        "thing": ["the battery storage site", "the offshore wind farm", "the rooftop solar programme",
                  "the heat-pump subsidy", "the transmission upgrade", "the demand-response pilot"],
        "metric": ["capacity factor", "curtailment", "the cost per megawatt-hour", "peak demand",
                   "carbon intensity", "connection queue times"],
        "event": ["the cold snap in January", "the new feed-in tariff", "the permitting reform",
                  "the turbine recall", "the record solar output in June"],
        "cause": ["a bottleneck at the substation", "delays in turbine deliveries", "low wind over the summer",
                  "rising interest rates", "slow permitting at the county level"],
        "action": ["add four hours of battery storage", "reinforce the northern transmission line",
                   "pay households to shift demand", "bundle small projects into one permit",
                   "sign a long-term supply contract"],
        "outcome": ["curtailment fell sharply", "bills stabilised for most households",
                    "the project came in under budget", "the grid rode through the peak without blackouts"],
        "place": ["the coastal plain", "the northern valleys", "the industrial estate", "the island grid"],
    },
    {
        "org": ["Maple Ridge University", "the admissions office", "the computer science department",
                "a secondary school in Leeds"],
        "person": ["Professor Anita Desai", "Gareth Hughes, the registrar", "Sofia Rossi, a graduate student",
                   "Dr. Kwame Mensah, head of teaching"],
        "thing": ["the first-year curriculum", "the online library", "the tutoring scheme", "the exam timetable",
                  "the new learning platform", "the scholarship fund"],
        "metric": ["pass rates", "dropout rates", "course evaluations", "library visits",
                   "applications from abroad", "the student-to-staff ratio"],
        "event": ["the switch to hybrid teaching", "the strike in spring", "the curriculum review",
                  "the launch of the data science degree", "the cut in government funding"],
        "cause": ["timetable clashes between core modules", "a shortage of teaching assistants",
                  "rising rents near campus", "an exam format that rewarded memorisation",
                  "poor Wi-Fi in the lecture halls"],
        "action": ["move to continuous assessment", "offer peer tutoring in the first term",
                   "record every lecture", "expand the hardship fund", "hire three more teaching fellows"],
        "outcome": ["pass rates rose in every cohort", "fewer students left after the first year",
                    "course evaluations improved markedly", "the waiting list for tutoring disappeared"],
        "place": ["the main campus", "the medical school", "the evening programme", "the São Paulo exchange"],
    },
    {
        "org": ["Fjord Freight", "the logistics team", "a cold-chain carrier", "the port authority"],
        "person": ["Henrik Larsen, the fleet manager", "Nadia Popescu, a dispatcher", "Victor Chen from procurement",
                   "Grace Okafor, the warehouse supervisor"],
        "thing": ["the cross-dock in Rotterdam", "the routing software", "the refrigerated fleet",
                  "the customs process", "the last-mile vans", "the pallet tracking system"],
        "metric": ["on-time deliveries", "fuel cost per kilometre", "dwell time at the port", "damaged shipments",
                   "truck utilisation", "the cost per parcel"],
        "event": ["the port strike", "the fuel price spike", "the new customs rules", "the peak season in November",
                  "the move to electric vans"],
        "cause": ["congestion at the container terminal", "paperwork errors at the border",
                  "half-empty return trips", "a scanner outage at the depot", "poorly planned routes"],
        "action": ["consolidate shipments on the Hamburg lane", "pre-file customs declarations",
                   "plan routes the night before", "add return loads from local suppliers",
                   "replace the oldest scanners"],
        "outcome": ["dwell time fell to under a day", "fuel costs dropped by a tenth",
                    "damaged shipments became rare", "utilisation climbed above ninety percent"],
        "place": ["the Baltic route", "the Hamburg lane", "the München hub", "the southern depots"],
    },
    {
        "org": ["Ledgerly", "the finance team", "a credit union", "the audit committee"],
        "person": ["Rebecca Stone, the CFO", "Arjun Nair, a financial analyst", "Paolo Bianchi, the controller",
                   "Yuki Tanaka from treasury"],
        "thing": ["the quarterly forecast", "the expense policy", "the invoicing system", "the savings account offer",
                  "the payroll process", "the fraud checks"],
        "metric": ["operating margin", "days sales outstanding", "customer churn", "the cost of acquisition",
                   "default rates", "cash on hand"],
        "event": ["the rate rise in October", "the acquisition of a smaller rival", "the audit last spring",
                  "the switch to a new accounting system", "the price change for premium plans"],
        "cause": ["invoices sent late by two weeks", "a spike in chargebacks", "discounts granted without approval",
                  "a currency swing against the euro", "manual reconciliation errors"],
        "action": ["automate the invoice reminders", "require approval for discounts above 10 percent",
                   "hedge half of the euro exposure", "close the books within five days",
                   "tighten the fraud rules for new accounts"],
        "outcome": ["cash collection sped up", "the margin recovered within two quarters",
                    "the auditors raised no findings", "chargebacks fell below one percent"],
        "place": ["the European entity", "the retail banking arm", "the Singapore office", "head office"],
    },
]

PERIODS = ["last quarter", "over the past year", "in the first half of the year", "since January",
           "during the summer", "over three consecutive months", "in the most recent survey",
           "compared with the same period last year"]
CHANGES = ["rose by {pct} percent", "fell by {pct} percent", "doubled", "held steady",
           "dropped to its lowest level in {n} years", "climbed slowly but steadily",
           "improved by {pct} percent", "worsened for {n} months in a row"]
WHENS = ["last quarter", "early this year", "in the spring", "after months of debate", "late last year",
         "in the first week of May"]
DEADLINES = ["the end of the year", "next spring", "the next budget cycle", "the summer", "the board meeting in June"]

SENTENCES = [
    "{Org} reported that {metric} {change} {period}, largely because of {cause}.",
    "According to {who}, the biggest risk is that {thing} cannot keep up after {event}.",
    "{When}, {org} decided to {action}, and {outcome}.",
    "The decision to {action} was not unanimous: {person} argued that {cause} mattered more.",
    "One detail stands out: {metric} for {thing} stayed flat even after {event}.",
    "In {place}, the picture was different, and {metric} {change}.",
    "Few people expected {event} to affect {thing}, but within weeks it did.",
    "{Person} wrote in a memo that the team should {action} before {deadline}.",
    "If the current trend holds, {metric} will keep moving in the same direction until {deadline}.",
    "Critics point out that the problem of {cause} is not new: it was first flagged in {year}.",
    "The budget for {thing} grew from {money1} to {money2} over {n} years.",
    "A follow-up review found that {outcome} once the changes were in place.",
    "It is worth noting that {place} accounted for roughly {pct} percent of the total.",
    "When asked about {event}, {person} said the lesson was simple: {action} sooner.",
    "There is still disagreement about whether {cause} or {cause2} did more damage.",
    "Staff interviewed for this report described {thing} as slow, fragile and hard to change.",
    "The data for {place} is incomplete, so the figures below should be read with some caution.",
    "By comparison, {org2} chose to {action2}, with mixed results.",
    "The plan is to {action} first and to revisit {thing} after {deadline}.",
    "Most of the improvement in {metric} came in the last {n} weeks of the period.",
    "{Person} estimates that the change will save about {money1} a year.",
    "Not everyone is convinced; some worry that {cause} will return as soon as attention moves elsewhere.",
]

HEADLINES = [
    "How {org} turned around {metric}", "What {event} taught us about {thing}",
    "{Thing}: a review of the year", "Why {metric} {change} {period}",
    "Lessons from {place}", "The case for changing {thing}",
]


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def _name(person: str) -> str:
    """The name alone: "Priya Raman, the on-call lead" and "Tomás Ortega from networking" lose the role."""
    return person.split(", ")[0].split(" from ")[0]


class Prose:
    """Sentences, paragraphs and passages about one domain, filled from its vocabulary."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self._deck: list[str] = []

    def domain(self) -> dict[str, list[str]]:
        return self.rng.choice(DOMAINS)

    def fill(self, template: str, d: dict[str, list[str]]) -> str:
        r = self.rng
        org, org2 = r.sample(d["org"], 2)
        cause, cause2 = r.sample(d["cause"], 2)
        action, action2 = r.sample(d["action"], 2)
        person = r.choice(d["person"])
        # "Name, role" needs a closing comma as a subject ("Name, the CFO, said"); bare name elsewhere.
        subject = person + "," if ", " in person else person
        thing = r.choice(d["thing"])
        period = r.choice(PERIODS)
        money1 = r.randrange(40, 900) * 1000
        money2 = money1 + r.randrange(20, 600) * 1000
        values = {
            "org": org, "org2": org2, "person": subject, "who": _name(person), "thing": thing,
            "when": r.choice(WHENS),
            "metric": r.choice(d["metric"]), "event": r.choice(d["event"]), "cause": cause, "cause2": cause2,
            "action": action, "action2": action2,
            "outcome": r.choice(d["outcome"]), "place": r.choice(d["place"]), "period": period,
            "deadline": r.choice(DEADLINES), "year": str(r.randrange(2012, 2023)),
            "money1": f"${money1:,}", "money2": f"${money2:,}", "pct": str(r.randrange(3, 48)),
            "n": str(r.randrange(2, 9)),
        }
        values["change"] = r.choice(CHANGES).format(pct=values["pct"], n=values["n"])
        values.update({f"{k[0].upper()}{k[1:]}": _cap(v) for k, v in list(values.items())})
        return template.format(**values)

    def sentence(self, d: dict[str, list[str]]) -> str:
        # Deal templates from a shuffled deck so one passage does not repeat a sentence shape.
        if not self._deck:
            self._deck = list(SENTENCES)
            self.rng.shuffle(self._deck)
        return self.fill(self._deck.pop(), d)

    def paragraph(self, d: dict[str, list[str]]) -> str:
        return " ".join(self.sentence(d) for _ in range(self.rng.randrange(3, 7)))

    def headline(self, d: dict[str, list[str]]) -> str:
        return self.fill(self.rng.choice(HEADLINES), d)

    def passage(self, d: dict[str, list[str]], target_tokens: int) -> str:
        """A titled article of about target_tokens (it stops at the first paragraph past it)."""
        parts = [self.headline(d)]
        size = estimate_tokens(parts[0])
        while size < target_tokens:
            p = self.paragraph(d)
            parts.append(p)
            size += estimate_tokens(p) + 1
        return "\n\n".join(parts)

    def transcript(self, d: dict[str, list[str]], target_tokens: int) -> str:
        """A meeting transcript: speakers taking turns, each saying one to three sentences."""
        speakers = [_name(p) for p in d["person"]]
        lines = [f"Meeting notes: {_cap(self.rng.choice(d['thing']))} (weekly sync)"]
        size = estimate_tokens(lines[0])
        while size < target_tokens:
            said = " ".join(self.sentence(d) for _ in range(self.rng.randrange(1, 4)))
            line = f"{self.rng.choice(speakers)}: {said}"
            lines.append(line)
            size += estimate_tokens(line) + 1
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Chat: everyday assistant conversations, several turns, ending on the user.

CHAT_TOPICS: list[dict[str, list[str]]] = [
    {
        "ask": ["Can you suggest a three-day itinerary for {city}? I like museums and good coffee.",
                "I'm visiting {city} in {month}. What should I pack?",
                "What's the cheapest way to get around {city} without a car?"],
        "advice": ["buy a multi-day transit pass on arrival", "keep the first morning free for the old town",
                   "book the popular museums online a week ahead", "pack layers, since evenings get cool",
                   "try the market halls for lunch rather than the tourist restaurants",
                   "walk between neighbourhoods that are close together", "carry a small amount of cash for cafés"],
    },
    {
        "ask": ["I have chicken thighs, rice and some spinach. What can I cook tonight?",
                "How do I make a sourdough starter from scratch?",
                "What's a good vegetarian dish to bring to a dinner party for {n} people?"],
        "advice": ["brown the chicken well before adding any liquid", "rinse the rice until the water runs clear",
                   "add the spinach at the very end so it just wilts", "feed the starter at the same time every day",
                   "keep the starter somewhere warm but out of direct sun", "season in stages and taste as you go",
                   "make the sauce a day ahead, because it tastes better"],
    },
    {
        "ask": ["I want to start running but I get out of breath after five minutes. Any tips?",
                "How many days a week should a beginner lift weights?",
                "What's a realistic plan to run a 10k in {n} weeks?"],
        "advice": ["alternate one minute of running with two minutes of walking", "slow down until you can talk in full sentences",
                   "add no more than ten percent to your weekly distance", "take at least one full rest day each week",
                   "warm up for five minutes before every session", "focus on form before adding weight",
                   "sleep and food matter as much as the training itself"],
    },
    {
        "ask": ["How should I split my salary between saving and spending?",
                "Is it better to pay off my student loan early or invest the money?",
                "Can you explain how an index fund works in simple terms?"],
        "advice": ["build an emergency fund of three to six months of expenses first",
                   "pay off any debt with an interest rate above what you expect to earn",
                   "automate the transfer to savings on payday", "keep fees low, because they compound too",
                   "write down every expense for one month to see where money goes",
                   "avoid trying to time the market"],
    },
    {
        "ask": ["I have a job interview for a data analyst role on {weekday}. How should I prepare?",
                "How do I ask my manager for a raise without sounding demanding?",
                "Can you help me rewrite this sentence for my CV: 'I was responsible for reports'?"],
        "advice": ["prepare two or three stories that show how you solved a real problem",
                   "research the company's products and recent news", "practise explaining one project out loud",
                   "bring numbers that show the impact of your work", "ask for a specific meeting rather than raising it in passing",
                   "lead with the result, then describe how you got there", "prepare a few questions for the interviewer"],
    },
    {
        "ask": ["My laptop has become really slow over the last month. What can I check?",
                "How do I back up photos from my phone without paying for cloud storage?",
                "My Wi-Fi keeps dropping in one room. What can I do?"],
        "advice": ["check which programs start automatically and disable the ones you don't need",
                   "make sure there is at least ten percent free disk space", "restart the router and update its firmware",
                   "move the router off the floor and away from thick walls", "copy the photos to an external drive once a month",
                   "keep a second copy somewhere other than your home", "look at the task manager while the slowdown happens"],
    },
    {
        "ask": ["I'm learning Spanish with an app but I can't hold a conversation. What should I change?",
                "What's the best way to memorise vocabulary?",
                "How long does it realistically take to become conversational in a new language?"],
        "advice": ["find a conversation partner for thirty minutes twice a week", "use spaced repetition for new words",
                   "listen to podcasts made for learners at your level", "write a short diary entry every evening",
                   "learn whole phrases instead of single words", "accept that mistakes are part of speaking"],
    },
    {
        "ask": ["My tomato plants have yellow leaves at the bottom. Is that a problem?",
                "What vegetables can I grow on a small balcony?",
                "When should I plant garlic?"],
        "advice": ["water deeply but less often", "remove the lowest leaves once the plant is established",
                   "choose compact varieties bred for containers", "make sure the pots have drainage holes",
                   "feed with a balanced fertiliser every two weeks in summer", "plant in autumn for a summer harvest"],
    },
]
CHAT_OPENERS = ["Good question.", "Sure, here's what I'd suggest.", "Happy to help.", "That's a common problem.",
                "Here are a few ideas.", "It depends a little on your situation, but generally:"]
ADVICE_FRAMES = ["A good first step is to {a}.", "It also helps to {a}.", "Many people find it easier to {a}.",
                 "If that doesn't work, try to {a}.", "I'd also recommend that you {a}.",
                 "One thing people often forget is to {a}.", "Where possible, {a}."]
FOLLOW_UPS = ["Thanks! Can you make that shorter?", "Could you give me a concrete example?",
              "What if I only have about {n} hours a week?", "That makes sense. What would you do first?",
              "Can you put that in a short checklist?", "Is there anything I should avoid?",
              "Okay, and how would that change if I were on a tight budget?", "Why does that work?"]
SYSTEM_PROMPTS = ["You are a helpful assistant. Answer concisely.",
                  "You are a friendly assistant. Keep answers practical and short.",
                  "You are an assistant for a consumer app. Be warm, accurate and brief."]
CITIES = ["Lisbon", "Kyoto", "Kraków", "Montréal", "Edinburgh", "Buenos Aires", "Seville", "Vienna"]
MONTHS = ["March", "May", "October", "December"]
WEEKDAYS = ["Monday", "Tuesday", "Thursday", "Friday"]


def chat_messages(rng: random.Random, target_tokens: int) -> list[dict[str, str]]:
    topic = rng.choice(CHAT_TOPICS)
    fmt = {"city": rng.choice(CITIES), "month": rng.choice(MONTHS), "n": rng.randrange(3, 12),
           "weekday": rng.choice(WEEKDAYS)}
    messages: list[dict[str, str]] = []
    if rng.random() < 0.5:
        messages.append({"role": "system", "content": rng.choice(SYSTEM_PROMPTS)})
    messages.append({"role": "user", "content": rng.choice(topic["ask"]).format(**fmt)})
    size = sum(estimate_tokens(m["content"]) for m in messages)
    # A user rarely asks the same follow-up twice in one conversation: deal them from a deck.
    follow_ups = rng.sample(FOLLOW_UPS, len(FOLLOW_UPS))
    while size < target_tokens:
        advice = rng.sample(topic["advice"], min(len(topic["advice"]), rng.randrange(2, 6)))
        frames = rng.sample(ADVICE_FRAMES, len(advice))
        reply = " ".join([rng.choice(CHAT_OPENERS)] + [f.format(a=a) for f, a in zip(frames, advice)])
        if not follow_ups:
            follow_ups = rng.sample(FOLLOW_UPS, len(FOLLOW_UPS))
        follow = follow_ups.pop().format(n=rng.randrange(2, 8))
        messages.append({"role": "assistant", "content": reply})
        messages.append({"role": "user", "content": follow})
        size += estimate_tokens(reply) + estimate_tokens(follow)
    return messages


# ---------------------------------------------------------------------------------------------
# RAG and summarisation prompts built from the prose above.

RAG_INSTRUCTIONS = [
    "Answer the question using only the passages below. Cite the passage numbers you rely on.",
    "You are given several documents retrieved from our knowledge base. Use them to answer the question at the end."
    " If the answer is not in the documents, say so.",
    "Read the context and answer the question in two or three sentences.",
]
RAG_QUESTIONS = [
    "What caused {metric} to change {period}?", "Who recommended that the team {action}, and why?",
    "How did {event} affect {thing}?", "What happened in {place}, according to the passages?",
    "What does {org} plan to do before {deadline}?", "Which problems are still unresolved?",
    "Summarise the disagreement about {cause}.", "What was the outcome of the decision to {action}?",
]
SUMMARY_INSTRUCTIONS = [
    "Summarize the following report in five bullet points.",
    "Write a one-paragraph executive summary of the text below for a busy manager.",
    "TL;DR the article below. Keep the key numbers.",
    "Summarise the meeting transcript below. List the decisions and the open action items separately.",
    "Condense the following document into a short brief with a headline and three key takeaways.",
]


def rag_prompt(prose: Prose, target_tokens: int) -> tuple[str, str]:
    """(instruction + numbered passages, question); the passages share one domain."""
    rng = prose.rng
    d = prose.domain()
    n_passages = rng.randrange(3, 7)
    per_passage = max(40, target_tokens // n_passages)
    passages = [f"[{i}] {prose.passage(d, per_passage)}" for i in range(1, n_passages + 1)]
    question = prose.fill(rng.choice(RAG_QUESTIONS), d)
    context = rng.choice(RAG_INSTRUCTIONS) + "\n\n" + "\n\n".join(passages)
    return context, question


def summary_prompt(prose: Prose, target_tokens: int) -> tuple[str, str]:
    """(instruction, document): a report or a meeting transcript."""
    rng = prose.rng
    d = prose.domain()
    instruction = rng.choice(SUMMARY_INSTRUCTIONS)
    if "transcript" in instruction:
        doc = prose.transcript(d, target_tokens)
    else:
        doc = prose.passage(d, target_tokens)
    return instruction, doc


# ---------------------------------------------------------------------------------------------
# Code: snippets in several languages, filled with names from a small data model.

ENTITIES = [("order", "orders"), ("invoice", "invoices"), ("shipment", "shipments"), ("reading", "readings"),
            ("ticket", "tickets"), ("booking", "bookings"), ("payment", "payments"), ("sample", "samples")]
FIELDS = ["amount", "priority", "weight_kg", "temperature_c", "duration_ms", "score", "quantity", "price"]
STATUSES = ["pending", "shipped", "failed", "open", "closed", "cancelled"]


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.capitalize() for p in rest)


def _pascal(name: str) -> str:
    return "".join(p.capitalize() for p in name.split("_"))


def _names(rng: random.Random) -> dict[str, str]:
    one, many = rng.choice(ENTITIES)
    fld = rng.choice(FIELDS)
    return {
        "one": one, "many": many, "field": fld, "Field": _pascal(fld), "fieldC": _camel(fld), "One": _pascal(one),
        "status": rng.choice(STATUSES), "limit": str(rng.choice([10, 25, 50, 100, 500])),
        "thr": str(rng.choice([0.5, 1.5, 10, 42, 99.9, 250])), "n": str(rng.randrange(2, 9)),
    }


CODE_SNIPPETS: dict[str, list[str]] = {
    "Python": [
        '''def top_{many}(items: list[dict], threshold: float = {thr}) -> list[dict]:
    """Return the {many} whose {field} is above the threshold, largest first."""
    result = []
    for item in items:
        value = item.get("{field}")
        if value is None:
            continue
        if value > threshold:
            result.append(item)
    return sorted(result, key=lambda x: x["{field}"], reverse=True)[:{limit}]
''',
        '''class {One}Repository:
    def __init__(self, conn):
        self.conn = conn

    def by_status(self, status: str = "{status}") -> list[dict]:
        cur = self.conn.execute(
            "SELECT id, {field}, status FROM {many} WHERE status = ? ORDER BY id LIMIT {limit}",
            (status,),
        )
        return [dict(zip(("id", "{field}", "status"), row)) for row in cur.fetchall()]

    def total_{field}(self) -> float:
        row = self.conn.execute("SELECT SUM({field}) FROM {many}").fetchone()
        return row[0] or 0.0
''',
        '''async def fetch_{many}(client, ids: list[int], concurrency: int = {n}) -> list[dict]:
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> dict:
        async with sem:
            resp = await client.get(f"/api/{many}/{{i}}")
            resp.raise_for_status()
            return resp.json()

    return await asyncio.gather(*(one(i) for i in ids))
''',
        '''def parse_{one}_line(line: str) -> dict:
    parts = line.strip().split(",")
    if len(parts) != 3:
        raise ValueError(f"expected 3 fields, got {{len(parts)}}: {{line!r}}")
    ident, status, raw = parts
    return {{"id": int(ident), "status": status, "{field}": float(raw)}}


def load_{many}(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as f:
        next(f)  # header
        return [parse_{one}_line(line) for line in f if line.strip()]
''',
        '''@dataclass
class {One}:
    id: int
    status: str
    {field}: float
    tags: list[str] = field(default_factory=list)

    def is_{status}(self) -> bool:
        return self.status == "{status}"


def test_top_{many}_orders_by_{field}():
    items = [{{"id": 1, "{field}": 5.0}}, {{"id": 2, "{field}": {thr}}}, {{"id": 3, "{field}": None}}]
    assert [i["id"] for i in top_{many}(items, threshold=1.0)] == [2, 1]
''',
    ],
    "JavaScript": [
        '''function summarize{One}s({many}) {{
  return {many}.reduce((acc, item) => {{
    const key = item.status || "unknown";
    acc[key] = acc[key] || {{ count: 0, {fieldC}: 0 }};
    acc[key].count += 1;
    acc[key].{fieldC} += item.{fieldC};
    return acc;
  }}, {{}});
}}
''',
        '''app.get("/api/{many}", async (req, res) => {{
  const limit = Math.min(parseInt(req.query.limit, 10) || {limit}, 500);
  try {{
    const rows = await db.query(
      "SELECT * FROM {many} WHERE status = $1 ORDER BY created_at DESC LIMIT $2",
      [req.query.status || "{status}", limit]
    );
    res.json(rows);
  }} catch (err) {{
    console.error(err);
    res.status(500).json({{ error: "could not load {many}" }});
  }}
}});
''',
        '''export function debounce(fn, waitMs = {limit}) {{
  let timer = null;
  return (...args) => {{
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), waitMs);
  }};
}}
''',
        '''export function {One}Table({{ {many} }}) {{
  const [sortKey, setSortKey] = useState("{fieldC}");
  const rows = [...{many}].sort((a, b) => b[sortKey] - a[sortKey]).slice(0, {limit});
  return (
    <table>
      <thead>
        <tr>
          <th onClick={{() => setSortKey("id")}}>ID</th>
          <th onClick={{() => setSortKey("{fieldC}")}}>{Field}</th>
          <th>Status</th>
        </tr>
      </thead>
      <tbody>
        {{rows.map((r) => (
          <tr key={{r.id}}>
            <td>{{r.id}}</td>
            <td>{{r.{fieldC}.toFixed(2)}}</td>
            <td>{{r.status}}</td>
          </tr>
        ))}}
      </tbody>
    </table>
  );
}}
''',
    ],
    "Go": [
        '''type {One} struct {{
	ID     int64
	Status string
	{Field} float64
}}

func Filter{One}s(items []{One}, min float64) []{One} {{
	var out []{One}
	for _, it := range items {{
		if it.{Field} >= min {{
			out = append(out, it)
		}}
	}}
	return out
}}
''',
        '''func handle{One}s(w http.ResponseWriter, r *http.Request) {{
	status := r.URL.Query().Get("status")
	if status == "" {{
		status = "{status}"
	}}
	items, err := store.List{One}s(r.Context(), status, {limit})
	if err != nil {{
		http.Error(w, "could not list {many}", http.StatusInternalServerError)
		return
	}}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(items)
}}
''',
        '''func process{One}s(ctx context.Context, jobs <-chan {One}, workers int) <-chan error {{
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {{
		wg.Add(1)
		go func() {{
			defer wg.Done()
			for job := range jobs {{
				if err := handle(ctx, job); err != nil {{
					errs <- err
				}}
			}}
		}}()
	}}
	go func() {{ wg.Wait(); close(errs) }}()
	return errs
}}
''',
    ],
    "Rust": [
        '''#[derive(Debug, Clone)]
pub struct {One} {{
    pub id: u64,
    pub status: String,
    pub {field}: f64,
}}

pub fn mean_{field}(items: &[{One}]) -> Option<f64> {{
    if items.is_empty() {{
        return None;
    }}
    let total: f64 = items.iter().map(|i| i.{field}).sum();
    Some(total / items.len() as f64)
}}
''',
        '''fn parse_{one}(line: &str) -> Result<{One}, String> {{
    let mut parts = line.split(',');
    let id = parts.next().ok_or("missing id")?.parse::<u64>().map_err(|e| e.to_string())?;
    let status = parts.next().ok_or("missing status")?.to_string();
    let {field} = parts.next().ok_or("missing {field}")?.trim().parse::<f64>().map_err(|e| e.to_string())?;
    Ok({One} {{ id, status, {field} }})
}}
''',
        '''use std::collections::HashMap;

pub fn totals_by_status(items: &[{One}]) -> HashMap<String, (usize, f64)> {{
    let mut totals: HashMap<String, (usize, f64)> = HashMap::new();
    for item in items {{
        let entry = totals.entry(item.status.clone()).or_insert((0, 0.0));
        entry.0 += 1;
        entry.1 += item.{field};
    }}
    totals
}}
''',
    ],
    "SQL": [
        '''SELECT c.region,
       COUNT(*) AS {many},
       AVG(o.{field}) AS avg_{field},
       SUM(CASE WHEN o.status = '{status}' THEN 1 ELSE 0 END) AS {status}_count
FROM {many} o
JOIN customers c ON c.id = o.customer_id
WHERE o.created_at >= DATE '2024-01-01'
GROUP BY c.region
HAVING COUNT(*) > {limit}
ORDER BY avg_{field} DESC;
''',
        '''WITH ranked AS (
    SELECT id, customer_id, {field},
           ROW_NUMBER() OVER (PARTITION BY customer_id ORDER BY {field} DESC) AS rn
    FROM {many}
    WHERE status <> 'cancelled'
)
SELECT customer_id, id, {field}
FROM ranked
WHERE rn <= {n};
''',
        '''CREATE TABLE {many} (
    id          BIGSERIAL PRIMARY KEY,
    customer_id BIGINT NOT NULL REFERENCES customers(id),
    status      TEXT NOT NULL DEFAULT '{status}',
    {field}     NUMERIC(12, 2),
    created_at  TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE INDEX {many}_customer_idx ON {many} (customer_id, created_at DESC);
''',
    ],
    "Java": [
        '''public class {One}Service {{
    private final {One}Repository repository;

    public {One}Service({One}Repository repository) {{
        this.repository = repository;
    }}

    public List<{One}> findLarge(double min) {{
        return repository.findAll().stream()
            .filter(o -> o.get{Field}() > min)
            .sorted(Comparator.comparing({One}::get{Field}).reversed())
            .limit({limit})
            .collect(Collectors.toList());
    }}
}}
''',
        '''@RestController
@RequestMapping("/api/{many}")
public class {One}Controller {{
    private final {One}Service service;

    public {One}Controller({One}Service service) {{
        this.service = service;
    }}

    @GetMapping
    public ResponseEntity<List<{One}>> list(@RequestParam(defaultValue = "{thr}") double min) {{
        List<{One}> result = service.findLarge(min);
        if (result.isEmpty()) {{
            return ResponseEntity.noContent().build();
        }}
        return ResponseEntity.ok(result);
    }}
}}
''',
    ],
    "Bash": [
        '''#!/usr/bin/env bash
set -euo pipefail
backup_dir="/var/backups/{many}"
mkdir -p "$backup_dir"
for db in $(psql -At -c "SELECT datname FROM pg_database WHERE datname LIKE '{one}%'"); do
  pg_dump "$db" | gzip > "$backup_dir/$db-$(date +%F).sql.gz"
done
find "$backup_dir" -name '*.sql.gz' -mtime +{n} -delete
''',
        '''#!/usr/bin/env bash
# Count failed {many} per hour from the application log.
set -euo pipefail
log="${{1:-/var/log/app/{many}.log}}"
grep -E 'status=(failed|{status})' "$log" \\
  | awk '{{ print substr($1, 1, 13) }}' \\
  | sort | uniq -c | sort -rn | head -n {limit}
''',
        '''#!/usr/bin/env bash
set -euo pipefail
release="$1"
ssh deploy@app-{n} "cd /srv/{many} && git fetch --tags && git checkout $release"
ssh deploy@app-{n} "sudo systemctl restart {one}-api"
for i in $(seq 1 30); do
  if curl -fsS "http://app-{n}:8080/health" > /dev/null; then
    echo "release $release is healthy"
    exit 0
  fi
  sleep 2
done
echo "release $release failed its health check" >&2
exit 1
''',
    ],
}
EXTENSION = {"Python": ".py", "JavaScript": ".js", "Go": ".go", "Rust": ".rs", "SQL": ".sql", "Java": ".java",
             "Bash": ".sh"}
FENCE = {"Python": "python", "JavaScript": "javascript", "Go": "go", "Rust": "rust", "SQL": "sql",
         "Java": "java", "Bash": "bash"}
EXPLAIN_ASKS = ["Can you explain what this {lang} code does, step by step?",
                "I inherited this {lang} code. What does it do and is there anything risky in it?",
                "Please review this {lang} code and suggest improvements."]
FIX_ASKS = ["This {lang} code gives the wrong result when the input is empty. Can you find the bug and fix it?",
            "I get the error below when I run this. What's wrong?\n\n{error}",
            "This works on small inputs but is very slow on a million rows. How can I make it faster?"]
WRITE_ASKS = ["Write a {lang} function that takes a list of {many} and returns the {n} with the highest {field}."
              " Include a short test.",
              "Write {lang} code that reads {many} from a CSV file, skips rows with a missing {field}, and prints"
              " the average {field} per status.",
              "Add error handling and logging to the {lang} code below, keeping its behaviour the same."]
ERRORS = {
    "Python": 'Traceback (most recent call last):\n  File "app.py", line {n}7, in <module>\n    main()\n'
              '  File "app.py", line {n}2, in main\n    value = item["{field}"]\nKeyError: \'{field}\'',
    "JavaScript": "TypeError: Cannot read properties of undefined (reading '{fieldC}')\n    at summarize{One}s (report.js:{n}4:21)",
    "Go": "panic: runtime error: index out of range [{n}] with length {n}\n\ngoroutine 1 [running]:\nmain.Filter{One}s(...)",
    "Rust": "error[E0308]: mismatched types\n  --> src/lib.rs:{n}:25\n   |\n   = note: expected `f64`, found `&str`",
    "SQL": "ERROR:  column \"o.{field}\" must appear in the GROUP BY clause or be used in an aggregate function",
    "Java": "java.lang.NullPointerException: Cannot invoke \"java.lang.Double.doubleValue()\" because the return value"
            " of \"{One}.get{Field}()\" is null",
    "Bash": "line {n}: pg_dump: command not found",
}


def code_request(rng: random.Random, target_tokens: int) -> str:
    """A user's code question: the ask, then fenced snippets until the target length."""
    lang = rng.choice(sorted(CODE_SNIPPETS))
    names = _names(rng)
    kind = rng.choices(["explain", "fix", "write"], weights=[4, 4, 2])[0]
    asks = {"explain": EXPLAIN_ASKS, "fix": FIX_ASKS, "write": WRITE_ASKS}[kind]
    ask = rng.choice(asks).format(lang=lang, error=ERRORS[lang].format(**names), **names)
    if kind == "write" and "below" not in ask:
        # A pure "write" request carries little code; pad with the surrounding module only when long.
        if target_tokens < 150:
            return ask
        ask += "\n\nFor context, here is the module it will live in:"
    parts = [ask]
    size = estimate_tokens(ask)
    deck: list[str] = []
    first = True
    while size < target_tokens:
        # Long requests paste several files: each template once per round, each file about other names.
        if not deck:
            deck = rng.sample(CODE_SNIPPETS[lang], len(CODE_SNIPPETS[lang]))
        file_names = names if first else _names(rng)
        code = deck.pop().format(**file_names).rstrip("\n")
        block = f"```{FENCE[lang]}\n{code}\n```"
        if not first or size + estimate_tokens(block) < target_tokens:
            block = f"`{file_names['many']}{EXTENSION[lang]}`:\n{block}"
        parts.append(block)
        size += estimate_tokens(block) + 1
        first = False
    return "\n\n".join(parts)


# ---------------------------------------------------------------------------------------------


def _lognormal_int(rng: random.Random, median: float, sigma: float) -> int:
    return max(1, round(rng.lognormvariate(math.log(median), sigma)))


def _input_tokens(req: dict) -> int:
    if "prompt" in req:
        return estimate_tokens(req["prompt"])
    return estimate_tokens("\n".join(m["content"] for m in req["messages"]))


def build_request(rng: random.Random, prose: Prose, category: str, max_total_tokens: int = MAX_TOTAL_TOKENS) -> dict:
    _, in_median, in_sigma, out_median, out_sigma = CATEGORIES[category]
    input_cap = min(MAX_INPUT_TOKENS, max_total_tokens - 4 * MIN_MAX_TOKENS)
    target = min(input_cap, _lognormal_int(rng, in_median, in_sigma))
    as_messages = rng.random() < MESSAGES_SHARE[category]
    req = build_input(rng, prose, category, target, as_messages)
    # Builders stop at the first sentence or paragraph past the target, so a long target can
    # overshoot; shrink it until the input leaves room for a minimal answer.
    while _input_tokens(req) > max_total_tokens - 4 * MIN_MAX_TOKENS:
        target = int(target * 0.8)
        req = build_input(rng, prose, category, target, as_messages)
    budget = max_total_tokens - _input_tokens(req)
    # Resample rather than clamp, so the cap does not pile requests up at one value.
    for _ in range(20):
        max_tokens = max(MIN_MAX_TOKENS, _lognormal_int(rng, out_median, out_sigma))
        if max_tokens <= budget:
            break
    else:
        max_tokens = budget
    req["max_tokens"] = max_tokens
    return req


def build_input(rng: random.Random, prose: Prose, category: str, target: int, as_messages: bool) -> dict:
    """The request's category and its prompt or messages, about target tokens long."""
    req: dict = {"category": category}
    if category == "chat":
        req["messages"] = chat_messages(rng, target)
    elif category == "rag":
        context, question = rag_prompt(prose, target)
        if as_messages:
            req["messages"] = [{"role": "system", "content": context}, {"role": "user", "content": question}]
        else:
            req["prompt"] = f"{context}\n\nQuestion: {question}\nAnswer:"
    elif category == "summarization":
        instruction, doc = summary_prompt(prose, target)
        if as_messages:
            req["messages"] = [{"role": "user", "content": f"{instruction}\n\n{doc}"}]
        else:
            req["prompt"] = f"{instruction}\n\n{doc}\n\nSummary:"
    else:
        text = code_request(rng, target)
        if as_messages:
            req["messages"] = [{"role": "system", "content": "You are an expert software engineer."},
                               {"role": "user", "content": text}]
        else:
            req["prompt"] = text
    return req


def generate(seed: int = SEED, count: int = COUNT, max_total_tokens: int = MAX_TOTAL_TOKENS) -> list[dict]:
    rng = random.Random(seed)
    prose = Prose(rng)
    names = list(CATEGORIES)
    counts = [round(CATEGORIES[c][0] * count) for c in names]
    counts[0] += count - sum(counts)
    categories = [c for c, k in zip(names, counts) for _ in range(k)]
    rng.shuffle(categories)
    out = []
    t_s = 0.0
    for i, category in enumerate(categories):
        req = build_request(rng, prose, category, max_total_tokens)
        record = {"id": f"prod-{i:04d}", **req, "timestamp_s": round(t_s, 3)}
        out.append(record)
        t_s += rng.expovariate(RATE_PER_S)
    return out


# ---------------------------------------------------------------------------------------------
# Chat sessions: conversations replayed turn by turn (the corpus's conversation form), whose
# long system prompts are shared across sessions, as an application's are.

SESSIONS_SEED = 20261203
SESSIONS_COUNT = 120
# Sessions start at this rate (Poisson); each user reads a reply for a lognormal think time.
SESSION_RATE_PER_S = 0.5
THINK_MEDIAN_S, THINK_SIGMA = 6.0, 0.6
# Turns per session: 1 + a geometric count (mean 1 / TURN_STOP turns in all), at most MAX_TURNS.
TURN_STOP, MAX_TURNS = 0.3, 8
APPS = ["a travel booking site", "a home-cooking app", "a fitness coaching service", "a personal finance app",
        "a careers platform", "a computer help desk", "a language learning app", "a garden centre"]
HOUSE_RULES = [
    "Answer in plain language and keep replies short unless the user asks for detail.",
    "Never invent prices, opening hours or availability; say when you do not know.",
    "Do not give medical, legal or tax advice beyond general information; suggest a professional.",
    "If a request is ambiguous, ask one clarifying question before answering.",
    "Refuse politely anything unsafe or unrelated to the service, and offer what you can do instead.",
    "Use the metric system unless the user uses other units.",
    "When you list steps, number them and keep each to one sentence.",
    "Mention the help centre when the user reports a problem with their account.",
]


def shared_system_prompts(rng: random.Random, prose: Prose) -> list[str]:
    """One long system prompt per application: its role, house rules and background notes."""
    prompts = []
    for app in APPS:
        d = prose.domain()
        rules = rng.sample(HOUSE_RULES, len(HOUSE_RULES))
        notes = " ".join(prose.paragraph(d) for _ in range(rng.randrange(2, 5)))
        prompts.append(
            f"You are the assistant of {app}. " + " ".join(rules) + "\n\nBackground notes for context:\n" + notes
        )
    return prompts


def chat_session(rng: random.Random, system: str, index: int, t_s: float) -> dict:
    """One conversation line: a topic's opening question, follow-ups, recorded replies."""
    topic = rng.choice(CHAT_TOPICS)
    fmt = {"city": rng.choice(CITIES), "month": rng.choice(MONTHS), "n": rng.randrange(3, 12),
           "weekday": rng.choice(WEEKDAYS)}
    n_turns = 1
    while n_turns < MAX_TURNS and rng.random() > TURN_STOP:
        n_turns += 1
    follow_ups = rng.sample(FOLLOW_UPS, len(FOLLOW_UPS))
    turns = []
    for k in range(n_turns):
        user = rng.choice(topic["ask"]).format(**fmt) if k == 0 else follow_ups.pop().format(n=rng.randrange(2, 8))
        advice = rng.sample(topic["advice"], min(len(topic["advice"]), rng.randrange(2, 6)))
        frames = rng.sample(ADVICE_FRAMES, len(advice))
        reply = " ".join([rng.choice(CHAT_OPENERS)] + [f.format(a=a) for f, a in zip(frames, advice)])
        turn: dict = {"user": user, "assistant": reply, "max_tokens": estimate_tokens(reply)}
        if k:
            turn["think_time_s"] = round(rng.lognormvariate(math.log(THINK_MEDIAN_S), THINK_SIGMA), 2)
        turns.append(turn)
    return {"id": f"chat-{index:04d}", "system": system, "timestamp_s": round(t_s, 3), "conversation": turns}


def generate_sessions(seed: int = SESSIONS_SEED, count: int = SESSIONS_COUNT) -> list[dict]:
    rng = random.Random(seed)
    systems = shared_system_prompts(rng, Prose(rng))
    out = []
    t_s = 0.0
    for i in range(count):
        out.append(chat_session(rng, rng.choice(systems), i, t_s))
        t_s += rng.expovariate(SESSION_RATE_PER_S)
    return out


def write_jsonl(records: list[dict], out: Path) -> None:
    """Write atomically, so an interrupted run never leaves a half corpus behind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, separators=(", ", ": ")) + "\n")
        # mkstemp creates the file 0600; a shipped data file should be readable like any other.
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Generate the planner's sample corpus (deterministic).")
    parser.add_argument("--out", type=Path, default=None,
                        help="output JSONL file (default: prod.jsonl, or chat-sessions.jsonl, next to this script)")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"random seed (default {SEED}; with --sessions {SESSIONS_SEED})")
    parser.add_argument("--sessions", type=int, default=None, metavar="N",
                        help="write N multi-turn chat sessions (conversation lines) instead of requests")
    parser.add_argument("--count", type=int, default=COUNT, help=f"number of requests (default {COUNT})")
    parser.add_argument(
        "--max-total-tokens",
        type=int,
        default=MAX_TOTAL_TOKENS,
        help=f"cap on estimated prompt + max_tokens per request (default {MAX_TOTAL_TOKENS})",
    )
    args = parser.parse_args(argv)
    if args.count < 1:
        parser.error(f"--count must be >= 1, got {args.count}")
    if args.max_total_tokens < 8 * MIN_MAX_TOKENS:
        parser.error(f"--max-total-tokens must be >= {8 * MIN_MAX_TOKENS}, got {args.max_total_tokens}")
    here = Path(__file__).resolve().parent
    if args.sessions is not None:
        if args.sessions < 1:
            parser.error(f"--sessions must be >= 1, got {args.sessions}")
        records = generate_sessions(SESSIONS_SEED if args.seed is None else args.seed, args.sessions)
        out = args.out or here / "chat-sessions.jsonl"
        write_jsonl(records, out)
        print(f"wrote {len(records)} sessions to {out}")
        return 0
    records = generate(SEED if args.seed is None else args.seed, args.count, args.max_total_tokens)
    out = args.out or here / "prod.jsonl"
    write_jsonl(records, out)
    print(f"wrote {len(records)} requests to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
