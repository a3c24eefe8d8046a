"""The demo as a new operator meets it: everyday bike-shop questions asked of the embedded
offline model, through the agent loop, over the shipped knowledge base (config/knowledge), are
answered from the right section."""

from __future__ import annotations

import re

import pytest

from core.agent.knowledge_tools import ReadKnowledge, SearchKnowledge
from core.agent.loop import AgentEvent, AgentLoop, Limits, RunOutcome, ToolStep, Turn
from core.agent.offline import GREETING, NOT_FOUND, OfflineModel
from core.agent.tools import ToolRegistry
from core.knowledge import KnowledgeBase

KNOWLEDGE_DIR = "config/knowledge"  # tests run with the repo root as cwd
_CITATION = re.compile(r"_Source: (.+?)_")

HOURS = "hours.md › Opening hours"
HOLIDAYS = "hours.md › Holiday hours"
DROP_OFF = "hours.md › Workshop drop-off times"
WHO = "about.md › Who we are"
LOCATION = "about.md › Location and address"
CONTACT = "about.md › Contact"
DIRECTIONS = "about.md › Directions"
PARKING = "about.md › Parking"
PRICES = "services-and-prices.md › Services and prices"
REPAIR_PRICES = "services-and-prices.md › Repair prices"
RENTAL_PRICES = "services-and-prices.md › Rental prices"
DEPOSITS = "services-and-prices.md › Deposits"
BOOKING = "faq.md › How do I book a repair or a rental?"
REPAIR_TIME = "faq.md › How long does a repair take?"
PAYMENT = "faq.md › What payment methods do you accept?"
WARRANTY = "faq.md › Do repairs come with a warranty?"
KIDS = "faq.md › Do you rent kids' bikes?"
HELMETS = "faq.md › Are helmets included with rentals?"
CANCEL = "faq.md › Can I cancel a rental reservation?"
E_BIKES = "faq.md › Do you repair e-bikes?"
ID = "faq.md › Do I need ID to rent a bike?"
SELLING = "faq.md › Do you sell bikes?"
RENTAL_TERMS = "policies.md › Rental terms"
DAMAGE = "policies.md › Damage and loss"
REFUNDS = "policies.md › Cancellations and refunds"
PRIVACY = "policies.md › Privacy"


@pytest.fixture(scope="module")
def kb() -> KnowledgeBase:
    return KnowledgeBase.from_dir(KNOWLEDGE_DIR)


async def ask(kb: KnowledgeBase, *messages: str, limits: Limits | None = None) -> RunOutcome:
    """One turn of the messages (several: collected while the agent was busy), as the web chat
    runs it on the embedded defaults: the offline model with the knowledge tools."""
    tools = ToolRegistry([SearchKnowledge(kb), ReadKnowledge(kb)])
    loop = AgentLoop(OfflineModel(), tools, limits or Limits())
    events: list[AgentEvent] = []

    async def emit(event: AgentEvent) -> None:
        events.append(event)

    turn = Turn(run_id="r1", session="s1", system="sys", history=[], user_texts=list(messages))
    outcome = await loop.run(turn, emit)
    assert outcome.status == "ok", outcome
    assert all(e.ok for e in events if isinstance(e, ToolStep))
    return outcome


# the questions of the new-operator review, with a fact the right answer holds
@pytest.mark.parametrize(
    ("question", "section", "fact"),
    [
        ("where are you located?", LOCATION, "14 Harbor Lane"),
        ("where is the shop?", LOCATION, "14 Harbor Lane"),
        ("what's your phone number?", CONTACT, "555-0142"),
        ("do you sell used bikes?", SELLING, "don't sell"),
        ("how much does it cost to rent a bike for a day?", RENTAL_PRICES, "$40 per day"),
        ("what time do you close today?", HOURS, "18:00"),
    ],
)
async def test_review_questions(kb: KnowledgeBase, question: str, section: str, fact: str) -> None:
    outcome = await ask(kb, question)
    assert _CITATION.findall(outcome.text) == [section]
    assert fact in outcome.text


@pytest.mark.parametrize(
    ("question", "section"),
    [
        # opening hours
        ("what are your opening hours?", HOURS),
        ("hours?", HOURS),
        ("opening times?", HOURS),
        ("when do you open?", HOURS),
        ("how late are you open?", HOURS),
        ("are you open on saturday?", HOURS),
        ("are you open on sunday?", HOURS),
        ("are you open today?", HOURS),
        ("what time do you open tomorrow?", HOURS),
        ("are you open on christmas?", HOLIDAYS),
        ("when can I drop off my bike for repair?", DROP_OFF),
        # prices, repairs and rentals
        ("what are your prices?", PRICES),
        ("prices?", PRICES),
        ("how much is a tune-up?", REPAIR_PRICES),
        ("how much to fix a flat tire?", REPAIR_PRICES),
        ("how much for a flat?", REPAIR_PRICES),
        ("how much is a brake service?", REPAIR_PRICES),
        ("how much does it cost to rent a bike?", RENTAL_PRICES),
        ("how much is a bike rental?", RENTAL_PRICES),
        ("how much is an e-bike rental per day?", RENTAL_PRICES),
        ("can I hire a bike for the day?", RENTAL_PRICES),
        ("how much to hire an e-bike for a week?", RENTAL_PRICES),
        ("what's the weekly rate for an e-bike?", RENTAL_PRICES),
        ("how much is the deposit?", DEPOSITS),
        ("can I get my deposit back?", DEPOSITS),
        ("do you rent kids bikes?", KIDS),
        ("are helmets included?", HELMETS),
        ("do you fix e-bikes?", E_BIKES),
        ("do you do repairs?", E_BIKES),
        ("how long does a repair take?", REPAIR_TIME),
        ("is there a warranty on repairs?", WARRANTY),
        ("do you sell bikes?", SELLING),
        # booking, returns and policies
        ("how do I book a repair?", BOOKING),
        ("can I reserve a bike?", BOOKING),
        ("do I need a reservation?", BOOKING),
        ("how do I cancel my reservation?", CANCEL),
        ("do I need ID to rent?", ID),
        ("when do I have to return the bike?", RENTAL_TERMS),
        ("what if I return the bike late?", RENTAL_TERMS),
        ("what's the late fee?", RENTAL_TERMS),
        ("can I return the bike the next day?", RENTAL_TERMS),
        ("can I get a refund?", REFUNDS),
        ("what happens if I damage the bike?", DAMAGE),
        ("what do you do with my data?", PRIVACY),
        # payment
        ("what payment methods do you accept?", PAYMENT),
        ("do you take credit cards?", PAYMENT),
        ("can I pay cash?", PAYMENT),
        ("do you take apple pay?", PAYMENT),
        ("do you accept checks?", PAYMENT),
        # location, directions, parking, contact
        ("what's your address?", LOCATION),
        ("address?", LOCATION),
        ("how do I get there?", DIRECTIONS),
        ("how do I get to you from the ferry?", DIRECTIONS),
        ("do you have a bus stop nearby?", DIRECTIONS),
        ("is there parking?", PARKING),
        ("where can I park?", PARKING),
        ("how can I contact you?", CONTACT),
        ("how can I reach you?", CONTACT),
        ("what's your email?", CONTACT),
        ("email address?", CONTACT),
        ("can I call you?", CONTACT),
        ("what's your number?", CONTACT),
        ("phone?", CONTACT),
        ("how do I contact the shop?", CONTACT),
    ],
)
async def test_everyday_questions(kb: KnowledgeBase, question: str, section: str) -> None:
    outcome = await ask(kb, question)
    assert _CITATION.findall(outcome.text) == [section]


async def test_who_are_you_is_not_guessed(kb: KnowledgeBase) -> None:
    # only stop words: nothing to search for, so an honest "not found" rather than a guess
    assert (await ask(kb, "who are you?")).text == NOT_FOUND


@pytest.mark.parametrize(
    ("question", "section"),
    [
        ("Hi! what's your phone number?", CONTACT),
        ("hi there, where is the shop?", LOCATION),
        ("Good morning! where can I park my car?", PARKING),
        ("hey, how much is a tune-up?", REPAIR_PRICES),
    ],
)
async def test_a_greeting_before_the_question_is_not_searched(
    kb: KnowledgeBase, question: str, section: str
) -> None:
    outcome = await ask(kb, question)
    assert _CITATION.findall(outcome.text) == [section]


async def test_collected_messages_are_answered_each(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "hi there, hours?", "and prices?")
    assert _CITATION.findall(outcome.text) == [HOURS, PRICES]
    assert "Monday" in outcome.text
    assert "$65" in outcome.text
    assert outcome.tool_calls == 2


async def test_in_a_group_the_words_are_searched_not_the_names(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "[from: Prices Lima, id 11]\nhello", "[from: Bob, id 22]\nhours?")
    assert _CITATION.findall(outcome.text) == [HOURS]
    assert outcome.tool_calls == 1


async def test_collected_messages_greeting_and_question(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "hello", "where is the shop?")
    assert _CITATION.findall(outcome.text) == [LOCATION]
    assert outcome.tool_calls == 1


async def test_collected_greetings_get_the_greeting(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "hi", "thanks!")
    assert outcome.text == GREETING
    assert outcome.tool_calls == 0


async def test_collected_messages_asking_the_same_give_it_once(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "hours?", "opening hours?")
    assert _CITATION.findall(outcome.text) == [HOURS]


async def test_many_collected_messages_are_searched_as_one(kb: KnowledgeBase) -> None:
    outcome = await ask(kb, "so", "about renting", "an e-bike", "per day", "how much?")
    assert outcome.tool_calls == 1
    assert _CITATION.findall(outcome.text) == [RENTAL_PRICES]
