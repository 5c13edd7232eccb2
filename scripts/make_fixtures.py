"""Write the small synthetic fixtures under ``data/fixtures/`` for tests and the fresh-clone job.

The real benchmarks may not be committed (LoCoMo is CC BY-NC and lives in ``../shared``), yet the
loaders must be tested against their exact schemas, quirks included. So this script builds
look-alikes from templates with a fixed seed: the same bytes on every run, no network.

* ``locomo_mini.json``: 3 conversations in the official LoCoMo schema. Every session has its own
  topic with distinctive words, so lexical retrieval can find the gold session of a question that
  mentions them. It carries each malformed-evidence case of the released file.
* ``longmemeval_mini.json``: 6 records in the official LongMemEval schema, with filler sessions
  shared between records (on different dates, as in the release) and one abstention question.
* ``users_mini.jsonl``: our own JSONL format, one English and one Chinese conversation.

Usage: ``python scripts/make_fixtures.py [--out DIR] [--check]``; ``--check`` exits 1 when the
committed files differ from what the generator would write.
"""

from __future__ import annotations

import argparse
import configparser
import json
import random
import sys
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

SEED = 20240501
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "data" / "fixtures"

# Spelled out rather than taken from calendar/strftime, whose names follow the locale.
MONTHS = tuple(
    "January February March April May June July August September October November December".split()
)
WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


@dataclass(frozen=True)
class Topic:
    """One session's subject: what the owner says, and what can be asked about it."""

    name: str
    intro: str
    reaction: str  # the other speaker's first reply
    fact1: str
    ask1: str  # question about the owner ({S}); its gold answer is answer1
    answer1: str
    fact2: str
    ask2: str
    answer2: str
    extra1: str
    extra2: str
    caption: str  # blip_caption when the session shares an image
    event: str  # "When did {S} <event>?"
    would: str  # "Would {S} <would>?"
    would_answer: str

    def fact(self, k: int) -> tuple[str, str, str]:
        """(statement, question, answer) of fact ``k`` (0 or 1)."""
        n = k + 1
        return getattr(self, f"fact{n}"), getattr(self, f"ask{n}"), getattr(self, f"answer{n}")


# One INI section per topic. Plain text rather than nested literals keeps the bank readable and
# lets a topic be added without touching code; every field is required.
TOPIC_BANK = """
[hiking trip]
intro = I just got back from a hiking trip in the mountains, the trail was steep but gorgeous.
reaction = A hiking trip sounds amazing! Which mountain trail did you hike?
fact1 = We finally reached the summit of Mount Cedar after six hours on the switchbacks.
ask1 = Which summit did {S} reach on the hiking trip?
answer1 = Mount Cedar
fact2 = I bought a green hiking backpack with a water bladder so I never ran dry on the trail.
ask2 = What color is the hiking backpack {S} bought?
answer2 = green
extra1 = My boots got muddy crossing the creek near the trailhead.
extra2 = Next time I want to hike the ridge at sunrise with trekking poles.
caption = a photo of hikers standing on a rocky mountain summit above the clouds
event = go on the hiking trip to the mountains
would = enjoy a long hike on a mountain trail
would_answer = Yes, she loves hiking

[adopting a dog]
intro = Big news, we adopted a dog from the animal shelter last weekend!
reaction = You adopted a dog? What breed is the puppy from the shelter?
fact1 = He is a beagle puppy and we named him Biscuit because of his brown ears.
ask1 = What is the name of the beagle puppy {S} adopted?
answer1 = Biscuit
fact2 = The shelter volunteers gave us a red leash and a chew toy shaped like a bone.
ask2 = What color is the leash the shelter gave {S} for the puppy?
answer2 = red
extra1 = Biscuit already knows how to sit for a treat, the beagle is so smart.
extra2 = House training the puppy is hard, he chewed my slippers twice.
caption = a photo of a beagle puppy with a red leash sitting on a rug
event = adopt the beagle puppy from the shelter
would = adopt another dog from a shelter
would_answer = Likely yes, she loves Biscuit

[pottery class]
intro = I signed up for a pottery class at the community studio, working with clay is so calming.
reaction = A pottery class! Have you tried throwing clay on the wheel yet?
fact1 = On the pottery wheel I made a lopsided blue bowl and glazed it for the kiln.
ask1 = What did {S} make on the pottery wheel?
answer1 = a blue bowl
fact2 = Our pottery teacher Mrs. Okafor fires everything in the kiln on Thursdays.
ask2 = Who teaches the pottery class {S} takes?
answer2 = Mrs. Okafor
extra1 = The glaze came out glossy after the kiln firing, the clay cracked only a little.
extra2 = Next pottery class we learn to trim mugs and attach handles.
caption = a photo of a handmade blue ceramic bowl next to a pottery wheel
event = start the pottery class at the community studio
would = enjoy a ceramics workshop
would_answer = Yes, she enjoys pottery

[marathon training]
intro = I'm training for my first marathon, my running plan has me at forty miles a week.
reaction = A marathon is a big deal! How far was your longest training run?
fact1 = My longest training run was eighteen miles along the river path in new sneakers.
ask1 = How long was the longest marathon training run of {S}?
answer1 = eighteen miles
fact2 = The marathon is the Harbor City Marathon in October, my race bib number is 2417.
ask2 = Which marathon is {S} training for?
answer2 = the Harbor City Marathon
extra1 = I ice my knees after every long run and stretch my hamstrings.
extra2 = Carbo loading with pasta before the race is my favorite part of marathon training.
caption = a photo of a runner in bright sneakers on a river path at dawn
event = run the eighteen mile marathon training run
would = sign up for another marathon
would_answer = Likely yes

[sourdough baking]
intro = I've been baking sourdough bread, my starter finally bubbles after a week of feeding.
reaction = Homemade sourdough! Did the loaf rise well in the oven?
fact1 = I named my sourdough starter Gloria and feed her rye flour every morning.
ask1 = What did {S} name the sourdough starter?
answer1 = Gloria
fact2 = The first loaf baked in a dutch oven at 250 degrees and had a crackly crust.
ask2 = What did {S} bake the first sourdough loaf in?
answer2 = a dutch oven
extra1 = Shaping the dough is tricky, it sticks to the banneton basket.
extra2 = Next I'll try a sourdough focaccia with rosemary and olive oil.
caption = a photo of a crusty sourdough loaf cooling on a wire rack
event = bake the first sourdough loaf
would = enjoy a bread baking class
would_answer = Yes

[guitar lessons]
intro = I started guitar lessons, my fingertips hurt from pressing the steel strings.
reaction = Guitar lessons, cool! Which chords have you learned so far?
fact1 = My guitar teacher Luis taught me the G, C and D chords and a fingerpicking pattern.
ask1 = Who teaches {S} guitar?
answer1 = Luis
fact2 = I bought a used acoustic guitar made of mahogany from a pawn shop for ninety dollars.
ask2 = How much did {S} pay for the used acoustic guitar?
answer2 = ninety dollars
extra1 = Switching between chords fast is the hardest part of strumming.
extra2 = I want to play a song on the guitar at my sister's wedding.
caption = a photo of a mahogany acoustic guitar leaning against an amplifier
event = start taking guitar lessons
would = want to play guitar at an open mic night
would_answer = Likely yes

[vegetable garden]
intro = I planted a vegetable garden in the backyard with raised beds and fresh compost.
reaction = A vegetable garden! What are you growing in the raised beds?
fact1 = The cherry tomatoes are climbing the trellis and the zucchini leaves are huge.
ask1 = What is climbing the trellis in the vegetable garden of {S}?
answer1 = cherry tomatoes
fact2 = Rabbits ate my lettuce seedlings, so I put up a chicken wire fence around the garden.
ask2 = What ate the lettuce seedlings in the garden of {S}?
answer2 = rabbits
extra1 = I water the garden at dawn and turn the compost pile every Sunday.
extra2 = Next spring I'll add peppers, basil and a row of sunflowers to the garden.
caption = a photo of raised garden beds with tomato plants on a trellis
event = plant the vegetable garden in the backyard
would = join a community garden
would_answer = Yes, she loves gardening

[moving apartments]
intro = We are moving to a new apartment downtown, I'm drowning in cardboard boxes.
reaction = Moving is exhausting! When do you get the keys to the new apartment?
fact1 = The new apartment is on the ninth floor with a balcony facing the harbor.
ask1 = Which floor is the new apartment of {S} on?
answer1 = the ninth floor
fact2 = The landlord let us sign a two year lease and the movers come on Saturday.
ask2 = How long is the lease {S} signed for the new apartment?
answer2 = two years
extra1 = I labeled every moving box by room with a fat marker.
extra2 = Our old couch won't fit in the elevator of the new building.
caption = a photo of stacked cardboard moving boxes in an empty apartment
event = move into the new apartment downtown
would = move to a different city soon
would_answer = Likely no, she just moved downtown

[lake camping]
intro = We went camping by the lake, pitched the tent right next to the water.
reaction = Camping by the lake sounds peaceful! Did you make a campfire?
fact1 = We roasted marshmallows over the campfire and saw a bald eagle over the lake.
ask1 = What bird did {S} see over the lake while camping?
answer1 = a bald eagle
fact2 = I paddled a yellow kayak across Loon Lake at sunrise while everyone slept in the tent.
ask2 = What color was the kayak {S} paddled across Loon Lake?
answer2 = yellow
extra1 = A raccoon stole our bag of trail mix from the picnic table at the campsite.
extra2 = Next camping trip I'll bring a warmer sleeping bag, the lake nights were cold.
caption = a photo of a tent and a campfire beside a calm lake at dusk
event = go camping by Loon Lake
would = enjoy a weekend of camping
would_answer = Yes

[learning Spanish]
intro = I'm learning Spanish with a tutor twice a week, the verb conjugation is brutal.
reaction = Learning Spanish! Are you practicing conversation with your tutor?
fact1 = My Spanish tutor Marisol is from Seville and makes me conjugate irregular verbs.
ask1 = Where is the Spanish tutor of {S} from?
answer1 = Seville
fact2 = I'm learning Spanish because I'm planning a trip to Madrid next spring.
ask2 = Why is {S} learning Spanish?
answer2 = for a trip to Madrid
extra1 = I keep flashcards of Spanish vocabulary on the fridge.
extra2 = The subjunctive mood in Spanish grammar still confuses me.
caption = a photo of Spanish vocabulary flashcards spread on a kitchen table
event = start Spanish lessons with a tutor
would = enjoy watching Spanish films with subtitles
would_answer = Likely yes

[startup job interview]
intro = I had a job interview at a robotics startup, the recruiter called me back the same day.
reaction = A startup interview! How did the technical interview go?
fact1 = The robotics startup is called Kestrel Dynamics and they build warehouse robots.
ask1 = What is the name of the robotics startup where {S} interviewed?
answer1 = Kestrel Dynamics
fact2 = They made me an offer for a senior engineer role and I start in three weeks.
ask2 = What role was {S} offered at the robotics startup?
answer2 = senior engineer
extra1 = I rewrote my resume the night before the interview.
extra2 = The whiteboard interview asked me to design a scheduler for the robots.
caption = a photo of a small warehouse robot carrying a cardboard box
event = interview at the robotics startup
would = prefer working at a startup over a big corporation
would_answer = Likely yes

[birdwatching]
intro = I've gotten into birdwatching, I take my binoculars to the marsh every morning.
reaction = Birdwatching is so relaxing! Which birds have you spotted at the marsh?
fact1 = At the marsh I spotted a great blue heron standing in the reeds.
ask1 = What bird did {S} spot in the reeds at the marsh?
answer1 = a great blue heron
fact2 = I hung two seed feeders and a hummingbird feeder outside my kitchen window.
ask2 = How many seed feeders did {S} hang outside the kitchen window?
answer2 = two
extra1 = A tiny yellow warbler landed on my binoculars strap, I couldn't believe it.
extra2 = I keep a birdwatching journal with sketches of every species.
caption = a photo of a great blue heron standing in marsh reeds
event = see the great blue heron at the marsh
would = enjoy a bird sanctuary visit
would_answer = Yes

[sunset painting]
intro = I painted a sunset over the ocean with acrylics on a big canvas.
reaction = An ocean sunset painting! What colors did you use on the canvas?
fact1 = I mixed orange, violet and gold acrylic paint for the sunset sky.
ask1 = Which colors did {S} mix for the sunset painting?
answer1 = orange, violet and gold
fact2 = The canvas is on an easel in my studio and I'll give the painting to my grandmother.
ask2 = Who will receive the sunset painting of {S}?
answer2 = her grandmother
extra1 = My brushes were stiff, so I bought a new set of filbert brushes for the painting.
extra2 = Painting helps me unwind after a long shift.
caption = a photo of an acrylic painting of an orange and violet ocean sunset on an easel
event = paint the ocean sunset on canvas
would = enjoy visiting an art museum
would_answer = Yes

[chess tournament]
intro = I played in a weekend chess tournament at the library, five rounds in two days.
reaction = A chess tournament! How did your games go?
fact1 = I won four of five chess games with the Sicilian Defense as black.
ask1 = Which opening did {S} play as black in the chess tournament?
answer1 = the Sicilian Defense
fact2 = My chess rating jumped to 1650 after the tournament.
ask2 = What chess rating did {S} reach after the tournament?
answer2 = 1650
extra1 = I lost one endgame because I blundered my knight on move forty.
extra2 = Now I study chess puzzles every night to sharpen my tactics.
caption = a photo of a wooden chess board mid game with a clock beside it
event = play in the chess tournament at the library
would = join a chess club
would_answer = Yes

[scuba diving]
intro = I got my scuba diving certification and did my first open water dive on a coral reef.
reaction = Scuba diving! What did you see on the reef?
fact1 = On the coral reef we swam with two sea turtles and a school of parrotfish.
ask1 = What did {S} swim with on the coral reef?
answer1 = two sea turtles
fact2 = My dive instructor Kai checked my oxygen tank and wetsuit before every dive.
ask2 = Who was the dive instructor of {S}?
answer2 = Kai
extra1 = Equalizing the pressure in my ears at twenty meters was tough.
extra2 = Next I want to try a night dive with an underwater flashlight.
caption = a photo of a diver in a wetsuit next to a sea turtle over a coral reef
event = do the first open water scuba dive
would = enjoy snorkeling on vacation
would_answer = Yes

[food bank volunteering]
intro = I started volunteering at the food bank, sorting donations on Saturday shifts.
reaction = Volunteering at the food bank is wonderful! What do you do on your shifts?
fact1 = At the food bank I pack canned goods and pasta into boxes for three hundred families.
ask1 = How many families does the food bank where {S} volunteers serve?
answer1 = three hundred
fact2 = The food bank pantry runs a holiday drive and I'm coordinating the turkey donations.
ask2 = What donations is {S} coordinating for the holiday drive?
answer2 = turkey donations
extra1 = The pantry shelves were empty by noon, the need is huge.
extra2 = I convinced my coworkers to do a volunteer shift at the food bank.
caption = a photo of volunteers sorting canned goods at a food bank
event = start volunteering at the food bank
would = donate to a charity drive
would_answer = Yes

[car restoration]
intro = I'm restoring an old car in my garage, a 1967 Mustang with a rusty engine.
reaction = Restoring a Mustang! What have you fixed on the car so far?
fact1 = I rebuilt the carburetor of the Mustang and replaced the spark plugs.
ask1 = What did {S} rebuild on the 1967 Mustang?
answer1 = the carburetor
fact2 = I'm painting the Mustang candy apple red once the engine runs.
ask2 = What color will {S} paint the Mustang?
answer2 = candy apple red
extra1 = My hands are always greasy from the engine, the garage smells like motor oil.
extra2 = I found original hubcaps for the car at a junkyard.
caption = a photo of a 1967 Mustang with its hood open in a garage
event = start restoring the Mustang in the garage
would = go to a classic car show
would_answer = Yes

[photography workshop]
intro = I took a photography workshop downtown, learning aperture and shutter speed.
reaction = A photography workshop! What kind of photos did you shoot?
fact1 = In the photography workshop I shot portraits with a 50mm lens at a wide aperture.
ask1 = Which lens did {S} use for portraits in the photography workshop?
answer1 = a 50mm lens
fact2 = I bought a carbon tripod for long exposure photos of the city skyline at night.
ask2 = What did {S} buy for long exposure photos?
answer2 = a carbon tripod
extra1 = The workshop instructor critiqued our photos with a projector.
extra2 = I'm editing the photography workshop portraits in my darkroom software.
caption = a photo of a camera with a 50mm lens on a tripod facing a city skyline
event = take the photography workshop downtown
would = enjoy a photography exhibition
would_answer = Yes
"""


def _topics() -> tuple[Topic, ...]:
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",))
    parser.read_string(TOPIC_BANK)
    return tuple(Topic(name=name, **dict(parser[name])) for name in parser.sections())


TOPICS = _topics()

FILLERS = (
    "That sounds great, tell me more!",
    "Wow, I'm so happy for you.",
    "How did that make you feel?",
    "Haha, I can totally imagine that.",
    "That's really inspiring, honestly.",
    "I love hearing about this stuff.",
    "No way, that's awesome!",
    "You always find the coolest things to do.",
)
GREETINGS = ("Hey {O}! ", "Hi {O}, long time no see! ", "Hey {O}, guess what? ", "")
CLOSINGS = ("Talk soon, take care!", "Catch you later, bye!", "Let's catch up again next week!")


# --------------------------------------------------------------------------------------------
# LoCoMo


def locomo_date(dt: datetime) -> str:
    hour = dt.hour % 12 or 12
    ampm = "am" if dt.hour < 12 else "pm"
    return f"{hour}:{dt.minute:02d} {ampm} on {dt.day} {MONTHS[dt.month - 1]}, {dt.year}"


def answer_date(dt: datetime) -> str:
    return f"{dt.day} {MONTHS[dt.month - 1]} {dt.year}"


def _session_turns(
    rng: random.Random, n: int, topic: Topic, owner: str, other: str, *, image: str | None
) -> list[dict]:
    """Odd turns (1, 3, 5, ...) are the owner's, so facts sit at ``DN:3`` and ``DN:5``."""
    n_turns = rng.randint(6, 10)
    owner_lines = [
        rng.choice(GREETINGS).format(O=other) + topic.intro,
        topic.fact1,
        topic.fact2,
        topic.extra1,
        topic.extra2,
    ]
    other_lines = [topic.reaction, *rng.sample(FILLERS, 3), rng.choice(CLOSINGS)]
    turns = []
    for m in range(1, n_turns + 1):
        if m % 2:
            turn = {"speaker": owner, "dia_id": f"D{n}:{m}", "text": owner_lines[m // 2]}
        else:
            last = m == n_turns
            text = other_lines[-1] if last else other_lines[m // 2 - 1]
            turn = {"speaker": other, "dia_id": f"D{n}:{m}", "text": text}
        turns.append(turn)
    if image is not None:
        # Same key order as the release: speaker, img_url, blip_caption, query, dia_id, text.
        t = turns[2]
        shared = {"speaker": t["speaker"]}
        if image != "caption-only":
            shared["img_url"] = [f"https://example.invalid/img/{n}_{rng.randrange(10**6):06d}.jpg"]
        shared["blip_caption"] = topic.caption
        if image == "with-query":
            shared["query"] = topic.name
        shared.update(dia_id=t["dia_id"], text=t["text"])
        turns[2] = shared
    return turns


def _conversation(
    rng: random.Random,
    sample_id: str,
    speakers: tuple[str, str],
    topics: list[Topic],
    start: datetime,
    quirks: str,
) -> dict:
    a, b = speakers
    conv: dict = {"speaker_a": a, "speaker_b": b}
    sessions: list[dict] = []  # per session: topic, owner, date
    dt = start
    for n, topic in enumerate(topics, start=1):
        owner, other = (a, b) if rng.random() < 0.5 else (b, a)
        image = None
        if n == 2:
            image = "with-query"
        elif n == 4:
            image = "caption-only" if quirks == "c" else "url"
        conv[f"session_{n}_date_time"] = locomo_date(dt)
        conv[f"session_{n}"] = _session_turns(rng, n, topic, owner, other, image=image)
        sessions.append({"topic": topic, "owner": owner, "other": other, "date": dt})
        dt += timedelta(
            days=rng.randint(3, 21), hours=rng.randint(-5, 5), minutes=rng.randint(0, 59)
        )
    if quirks == "c":
        # The release lists date_times for sessions it does not have; loaders must ignore them.
        conv[f"session_{len(topics) + 1}_date_time"] = locomo_date(dt)

    def fact(n: int, k: int) -> tuple[str, str]:
        s = sessions[n - 1]
        q, ans = s["topic"].fact(k)[1:]
        return q.format(S=s["owner"]), ans

    def hop(n: int, k: int) -> str:
        return f"D{n}:{3 + 2 * k}"

    qa: list[dict] = []
    # Single-hop, one per fact in sessions 1-3.
    for n, k in ((1, 0), (2, 1), (3, 0)):
        q, ans = fact(n, k)
        qa.append({"question": q, "answer": ans, "evidence": [hop(n, k)], "category": 4})
    s2, s3 = sessions[1], sessions[2]
    who = s2["owner"] if s2["owner"] == s3["owner"] else f"{s2['owner']} and {s3['owner']}"
    qa.append(
        {
            "question": f"What did {who} share about the {s2['topic'].name} and the "
            f"{s3['topic'].name}?",
            "answer": f"{s2['topic'].answer1}; {s3['topic'].answer1}",
            "evidence": [hop(2, 0), "D3:1"],
            "category": 1,
        }
    )
    s1 = sessions[0]
    qa.append(
        {
            "question": f"When did {s1['owner']} {s1['topic'].event}?",
            "answer": answer_date(s1["date"]),
            "evidence": ["D1:1"],
            "category": 2,
        }
    )
    s4 = sessions[3]
    qa.append(
        {
            "question": f"Would {s4['owner']} {s4['topic'].would}?",
            "answer": s4["topic"].would_answer,
            "evidence": [hop(4, 1)],
            "category": 3,
        }
    )
    # Adversarial: the fact is asked about the wrong speaker.
    for n, k in ((4, 0), (len(topics), 1)):
        s = sessions[n - 1]
        q, ans = s["topic"].fact(k)[1:]
        qa.append(
            {
                "question": q.format(S=s["other"]),
                "evidence": [hop(n, k)],
                "category": 5,
                "adversarial_answer": ans,
            }
        )

    # The malformed evidence of the released file, spread over the three conversations.
    if quirks == "a":
        qa[3]["evidence"] = [f"{hop(2, 0)}; D3:1"]  # several ids, ";"-separated
        qa[2]["evidence"] = ["D:3:3"]  # stray colon
        qa[5]["evidence"] = []  # no evidence at all
    elif quirks == "b":
        qa[3]["evidence"] = [f"{hop(1, 0)} {hop(2, 0)} {hop(2, 1)}"]  # several ids, spaces
        qa[0]["evidence"] = [hop(1, 0), "D", "D1:1"]  # a bare "D" among good ids
        qa[1]["evidence"] = ["D99:1"]  # a session the conversation does not have
    elif quirks == "c":
        # Two released category-5 items carry both answers; the adversarial one is the gold.
        s = sessions[3]
        qa[6] = {
            "question": f"Did {s['other']} share the photo of the {s['topic'].name}?",
            "adversarial_answer": "Yes",
            "answer": "No",
            "evidence": [hop(4, 0)],
            "category": 5,
        }

    return {
        "qa": qa,
        "conversation": conv,
        "event_summary": {
            f"events_session_{n}": {
                s["owner"]: [f"{s['owner']} talks about the {s['topic'].name}."],
                s["other"]: [],
                "date": f"{s['date'].day} {MONTHS[s['date'].month - 1]}, {s['date'].year}",
            }
            for n, s in enumerate(sessions, start=1)
        },
        "observation": {
            f"session_{n}_observation": {
                s["owner"]: [
                    [s["topic"].fact1, hop(n, 0)],
                    [s["topic"].fact2, hop(n, 1)],
                ],
                s["other"]: [[f"{s['other']} is curious about the {s['topic'].name}.", f"D{n}:2"]],
            }
            for n, s in enumerate(sessions, start=1)
        },
        "session_summary": {
            f"session_{n}_summary": (
                f"{a} and {b} talked on {answer_date(s['date'])}. {s['owner']} told "
                f"{s['other']} about the {s['topic'].name}."
            )
            for n, s in enumerate(sessions, start=1)
        },
        "sample_id": sample_id,
    }


def make_locomo(rng: random.Random) -> list[dict]:
    topics = list(TOPICS)
    rng.shuffle(topics)
    plan = (
        ("conv-m1", ("Ava", "Noah"), 5, datetime(2023, 3, 4, 13, 56), "a"),
        ("conv-m2", ("Priya", "Tom"), 6, datetime(2022, 8, 19, 10, 5), "b"),
        ("conv-m3", ("Lena", "Marco"), 4, datetime(2023, 6, 1, 19, 31), "c"),
    )
    out, used = [], 0
    for sample_id, speakers, n_sessions, start, quirks in plan:
        own, used = topics[used : used + n_sessions], used + n_sessions
        out.append(_conversation(rng, sample_id, speakers, own, start, quirks))
    return out


# --------------------------------------------------------------------------------------------
# LongMemEval


def lme_date(dt: datetime) -> str:
    return f"{dt:%Y/%m/%d} ({WEEKDAYS[dt.weekday()]}) {dt:%H:%M}"


def _chat(pairs: list[tuple[str, str]], answer_turns: tuple[int, ...] = ()) -> list[dict]:
    """User/assistant turns; ``has_answer`` appears only in answer sessions, as in the release."""
    turns = []
    for i, (user, assistant) in enumerate(pairs):
        for j, (role, content) in enumerate((("user", user), ("assistant", assistant))):
            t = {"role": role, "content": content}
            if answer_turns:
                t["has_answer"] = 2 * i + j in answer_turns
            turns.append(t)
    return turns


FILLER_SESSIONS = {
    "sharegpt_Xk2pQ9a_0": [
        (
            "Can you explain how a binary search works?",
            "Binary search halves a sorted list each step, comparing the middle element.",
        ),
        ("What is its time complexity?", "O(log n) comparisons in the worst case."),
    ],
    "ultrachat_412907": [
        (
            "Give me three tips for brewing better coffee at home.",
            "Use fresh beans, grind right before brewing, and keep water near 93 degrees Celsius.",
        ),
        ("Is a French press good for beginners?", "Yes, it is forgiving and cheap."),
    ],
    "sharegpt_Lm7tRw2_1": [
        (
            "Write a haiku about autumn leaves.",
            "Crimson leaves drifting / the maple lets go softly / wind carries the year.",
        ),
    ],
    "ultrachat_98311": [
        (
            "What are the health benefits of green tea?",
            "Green tea has antioxidants called catechins and a little caffeine.",
        ),
        ("How much per day is reasonable?", "Three to five cups is common for adults."),
    ],
}


def make_longmemeval(rng: random.Random) -> list[dict]:
    ev = {
        "answer_a1f3_1": _chat(
            [
                (
                    "I just adopted a rescue greyhound named Pepper, any tips for the first week?",
                    "Congratulations! Keep a quiet routine and give Pepper a soft bed.",
                ),
                ("She is scared of the stairs.", "Greyhounds often are; practise with treats."),
            ],
            answer_turns=(0,),
        ),
        "answer_b7c2_1": _chat(
            [
                (
                    "I'm planning a trip to Kyoto in April, which temples should I see?",
                    "Kinkaku-ji and Fushimi Inari are favourites.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_b7c2_2": _chat(
            [
                (
                    "I booked my hotel for the Lisbon trip in June near the Alfama district.",
                    "Alfama is lovely; try the tram 28.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_c93e_1": _chat(
            [
                (
                    "I started a new pottery course today, it runs for six weeks.",
                    "Enjoy the pottery course! Wheel throwing takes practice.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_c93e_2": _chat(
            [
                (
                    "I finished my pottery course today and made a teapot!",
                    "A teapot is ambitious, well done.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_d4a8_1": _chat(
            [
                (
                    "My personal best for the 5k is 27 minutes, can you build me a plan?",
                    "Sure: intervals on Tuesday, a tempo run Thursday and a long run Sunday.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_d4a8_2": _chat(
            [
                (
                    "Great news, I ran the 5k in 24 minutes this morning, a new personal best!",
                    "Huge improvement from 27 minutes, congratulations!",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_e0f1_1": _chat(
            [
                (
                    "My sister's favourite flower is the peony, what goes with it in a bouquet?",
                    "Peonies pair nicely with eucalyptus and garden roses.",
                ),
            ],
            answer_turns=(0,),
        ),
        "answer_f5b6_1": _chat(
            [
                (
                    "Can you recommend a sci-fi novel?",
                    "Try 'The Left Hand of Darkness' by Ursula K. Le Guin.",
                ),
                ("Thanks, anything else?", "'Hyperion' by Dan Simmons is another classic."),
            ],
            answer_turns=(1,),
        ),
    }
    sessions = {**{k: _chat(v) for k, v in FILLER_SESSIONS.items()}, **ev}
    fillers = list(FILLER_SESSIONS)

    records: list[tuple[str, str, str, str | None, list[str], datetime]] = [
        (
            "e47becba",
            "single-session-user",
            "What is the name of the greyhound I adopted?",
            "Pepper",
            ["answer_a1f3_1"],
            datetime(2023, 5, 30, 23, 40),
        ),
        (
            "2ce6a0f2",
            "multi-session",
            "Which two cities am I planning trips to?",
            "Kyoto and Lisbon",
            ["answer_b7c2_1", "answer_b7c2_2"],
            datetime(2023, 6, 2, 9, 15),
        ),
        (
            "gpt4_93f6379c",
            "temporal-reasoning",
            "How many days did my pottery course last?",
            None,
            ["answer_c93e_1", "answer_c93e_2"],
            datetime(2023, 8, 1, 18, 0),
        ),
        (
            "6a1eabeb",
            "knowledge-update",
            "What is my current personal best for the 5k?",
            "24 minutes",
            ["answer_d4a8_1", "answer_d4a8_2"],
            datetime(2023, 4, 11, 7, 5),
        ),
        (
            "gpt4_0b2f1d8c_abs",
            "single-session-user",
            "What is my brother's favourite flower?",
            "You did not mention this information. You mentioned your sister's favourite flower, "
            "the peony, but not your brother's.",
            ["answer_e0f1_1"],
            datetime(2023, 3, 9, 12, 30),
        ),
        (
            "58bf7951",
            "single-session-assistant",
            "Which second sci-fi novel did you recommend to me?",
            "Hyperion by Dan Simmons",
            ["answer_f5b6_1"],
            datetime(2023, 7, 20, 21, 45),
        ),
    ]
    out = []
    for qid, qtype, question, answer, gold, qdate in records:
        ids = [*rng.sample(fillers, 3), *gold]
        rng.shuffle(ids)
        # Answer sessions keep their story order (a course starts before it ends).
        slots = [i for i, s in enumerate(ids) if s in gold]
        for i, g in zip(slots, gold, strict=True):
            ids[i] = g
        # The release lists a haystack chronologically, ending before the question date.
        stamps, dt = [], qdate - timedelta(days=8 * len(ids) + rng.randint(1, 5))
        for _ in ids:
            dt += timedelta(
                days=rng.randint(2, 7), hours=rng.randint(0, 23), minutes=rng.randint(0, 59)
            )
            stamps.append(dt)
        if answer is None:  # temporal: the span between the two answer sessions
            first, last = (stamps[ids.index(g)] for g in gold)
            answer = f"{(last.date() - first.date()).days} days"
        out.append(
            {
                "question_id": qid,
                "question_type": qtype,
                "question": question,
                "answer": answer,
                "question_date": lme_date(qdate),
                "haystack_session_ids": ids,
                "haystack_dates": [lme_date(d) for d in stamps],
                "haystack_sessions": [sessions[s] for s in ids],
                "answer_session_ids": gold,
            }
        )
    return out


# --------------------------------------------------------------------------------------------
# Our JSONL


def make_jsonl() -> list[dict]:
    def turns(pairs: list[tuple[str, str]]) -> list[dict]:
        return [{"speaker": s, "text": t} for s, t in pairs]

    recs: list[dict] = [
        {
            "type": "session",
            "id": "u1-s1",
            "conversation_id": "user-1",
            "date": "2024-05-01 09:30",
            "turns": turns(
                [
                    ("user", "I signed up for a salsa dance class on Wednesday nights."),
                    ("assistant", "Salsa is fun! Do you have dance shoes yet?"),
                    ("user", "Not yet, my instructor Carla said suede soles are best."),
                ]
            ),
        },
        {
            "type": "session",
            "id": "u1-s2",
            "conversation_id": "user-1",
            "date": "2024-05-09 20:10",
            "turns": [
                {
                    "speaker": "user",
                    "text": "My laptop battery dies after an hour.",
                    "id": "u1-s2-t1",
                    "timestamp": "2024-05-09T20:10:00",
                },
                {
                    "speaker": "assistant",
                    "text": "Check the battery health report first.",
                    "id": "u1-s2-t2",
                    "timestamp": "2024-05-09T20:11:00",
                },
            ],
        },
        {
            "type": "session",
            "id": "u1-s3",
            "conversation_id": "user-1",
            "date": "2024-05-20 18:45",
            "turns": turns(
                [
                    ("user", "I'm hosting a barbecue on Saturday for twelve friends."),
                    ("assistant", "Grilled corn and burgers are easy crowd pleasers."),
                ]
            ),
        },
        {
            "type": "session",
            "id": "u2-s1",
            "conversation_id": "user-2",
            "date": "2024-03-02 10:00",
            "turns": turns(
                [
                    ("user", "周末我和朋友去黄山爬山了，山顶的云海特别美。"),
                    ("assistant", "黄山的云海很有名！爬山累不累？"),
                    ("user", "爬了六个小时，腿很酸，但是值得。"),
                ]
            ),
        },
        {
            "type": "session",
            "id": "u2-s2",
            "conversation_id": "user-2",
            "date": "2024-03-15 21:20",
            "turns": turns(
                [
                    ("user", "我最近领养了一只橘猫，给它取名叫年糕。"),
                    ("assistant", "年糕这个名字很可爱！猫咪适应新家了吗？"),
                ]
            ),
        },
        {
            "type": "session",
            "id": "u2-s3",
            "conversation_id": "user-2",
            "date": "2024-04-01 12:05",
            "turns": turns(
                [
                    ("user", "我在学做红烧肉，可是总是做得太咸。"),
                    ("assistant", "可以少放酱油，最后再调味。"),
                ]
            ),
        },
        {
            "type": "query",
            "id": "u1-q1",
            "conversation_id": "user-1",
            "question": "Who is my salsa dance instructor?",
            "answer": "Carla",
            "question_date": "2024-06-01",
            "gold_session_ids": ["u1-s1"],
            "category": "single-hop",
        },
        {
            "type": "query",
            "id": "u1-q2",
            "conversation_id": "user-1",
            "question": "How many friends am I hosting at the barbecue?",
            "answer": "twelve",
            "question_date": "2024-06-01",
            "gold_session_ids": ["u1-s3"],
            "category": "single-hop",
            "haystack": ["u1-s2", "u1-s3"],
        },
        {
            "type": "query",
            "id": "u1-q3",
            "conversation_id": "user-1",
            "question": "What is my favourite colour?",
            "answer": "",
            "category": "abstention",
        },
        {
            "type": "query",
            "id": "u2-q1",
            "conversation_id": "user-2",
            "question": "我上次去哪座山爬山了？",
            "answer": "黄山",
            "question_date": "2024-04-10",
            "gold_session_ids": ["u2-s1"],
            "category": "single-hop",
        },
        {
            "type": "query",
            "id": "u2-q2",
            "conversation_id": "user-2",
            "question": "我领养的猫叫什么名字？",
            "answer": "年糕",
            "question_date": "2024-04-10",
            "gold_session_ids": ["u2-s2"],
            "category": "single-hop",
        },
    ]
    return recs


# --------------------------------------------------------------------------------------------


def build_all() -> dict[str, str]:
    """File name -> exact text. One RNG per file, so editing one generator leaves others alone."""
    locomo = make_locomo(random.Random(f"{SEED}:locomo"))
    lme = make_longmemeval(random.Random(f"{SEED}:longmemeval"))
    jsonl = make_jsonl()
    return {
        "locomo_mini.json": json.dumps(locomo, indent=1, ensure_ascii=False) + "\n",
        "longmemeval_mini.json": json.dumps(lme, indent=1, ensure_ascii=False) + "\n",
        "users_mini.jsonl": "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in jsonl),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--check", action="store_true", help="compare, do not write")
    args = ap.parse_args(argv)
    files = build_all()
    if args.check:
        stale = [
            n
            for n, text in files.items()
            if not (args.out / n).exists() or (args.out / n).read_text(encoding="utf-8") != text
        ]
        for n in stale:
            print(f"stale: {args.out / n} (rerun scripts/make_fixtures.py)", file=sys.stderr)
        return 1 if stale else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
        print(f"wrote {args.out / name} ({len(text.encode('utf-8')):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
