"""Named-user rendering of LongMemEval training questions (docs/reranker.md "The LoCoMo name gap").

LongMemEval's questions speak in the first person ("Where do I take yoga classes?") about turns
rendered ``user: ...``; LoCoMo's name the speaker ("What is Caroline's identity?") about turns
rendered ``Caroline: ...``. A cross-encoder trained only on the first gets no practice at the
second: matching a name in the question to the speaker prefix of a turn. For a seeded share of
the training questions, the miner renders the haystack's user turns under a first name and
rewrites the question's first person to that name; the other questions stay as they are, so the
model keeps the first-person skill the service's own agents need.

The names are common English first names chosen for this module; none is a LoCoMo speaker, so
no evaluated conversation's name is seen in training. Pure functions, no I/O.
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterable, Mapping

__all__ = ["FIRST_NAMES", "assign_names", "name_question"]

FIRST_NAMES: tuple[str, ...] = (
    "Alice", "Amir", "Anna", "Ben", "Carla", "Chen", "Daniel", "Diana", "Elena", "Ethan", "Fatima", "Felix",
    "Grace", "Hannah", "Hugo", "Isabel", "Ivan", "Jack", "Julia", "Karim", "Laura", "Leo", "Lucy", "Marco",
    "Mia", "Nadia", "Noah", "Olivia", "Oscar", "Paula", "Peter", "Priya", "Rachel", "Rosa", "Ryan", "Sara",
    "Simon", "Sofia", "Tom", "Vera", "Victor", "Yuki", "Zoe", "Kenji", "Lena", "Omar", "Rita", "Theo",
)
"""Names a named question may get. None is a LoCoMo speaker (Caroline, Melanie, Jon, Gina, John,
Maria, Joanna, Nate, Tim, Audrey, Andrew, James, Deborah, Jolene, Evan, Sam, Calvin, Dave)."""

# Longest patterns first; each is matched on word boundaries, case-insensitively.
_REWRITES: tuple[tuple[str, str], ...] = (
    (r"I['’]m", "{n} is"), (r"I['’]ve", "{n} has"), (r"I['’]ll", "{n} will"), (r"I['’]d", "{n} would"),
    (r"am I", "is {n}"), (r"I am", "{n} is"), (r"have I", "has {n}"), (r"I have", "{n} has"),
    (r"do I", "does {n}"), (r"myself", "{n}"), (r"mine", "{n}'s"), (r"my", "{n}'s"), (r"me", "{n}"), (r"I", "{n}"),
)
# one capturing group per rule, so a match's ``lastindex`` names the rule that matched
_PATTERN = re.compile("|".join(rf"(?<![\w'’])({p})(?![\w'’])" for p, _ in _REWRITES), re.IGNORECASE)


def name_question(question: str, name: str) -> str:
    """``question`` with its first person rewritten to ``name`` ("Where do I take yoga classes?"
    with "Lena": "Where does Lena take yoga classes?").

    Rewrites I / me / my / mine / myself and the contractions and inversions that change the
    verb (I'm, I've, I'll, I'd as "would", am I, I am, have I, I have, do I); other verbs keep their form
    ("I take" becomes "Lena take"), which is the price of a rule list. "I" is matched with its
    case; the other words in any case, and a rewritten word that began with a capital still does
    ("Am I" becomes "Is Lena"). Second person ("you", the assistant) is left alone.

    Raises:
        ValueError: if ``name`` is blank.
    """
    if not name.strip():
        raise ValueError("name must be a non-blank first name")

    def replace(match: re.Match[str]) -> str:
        word = match.group(0)
        if word.lower() == "i" and word != "I":
            return word  # the letter i inside a list ("option i") is not the speaker
        out = _REWRITES[match.lastindex - 1][1].format(n=name)
        return out[0].upper() + out[1:] if word[0].isupper() else out

    return _PATTERN.sub(replace, question)


def assign_names(question_ids: Iterable[str], share: float, seed: int,
                 questions: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The questions rendered under a name, and the name of each: ``{question_id: first name}``.

    Each question is drawn independently with ``random.Random(f"{seed}:named:{question_id}")``:
    named with probability ``share``, then given one of :data:`FIRST_NAMES`; a name that is
    already a word of its text in ``questions`` (``{question_id: text}``) is drawn again from the
    others, so "Where did Rachel move?" is never asked of a user renamed Rachel. The draw depends only on
    the seed, the id and the question, so a question keeps its name whatever else is trained with it.

    Raises:
        ValueError: unless ``0 <= share <= 1``.
    """
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    names: dict[str, str] = {}
    for qid in question_ids:
        rng = random.Random(f"{seed}:named:{qid}")
        if rng.random() < share:
            name = rng.choice(FIRST_NAMES)
            taken = set(re.findall(r"\w+", (questions or {}).get(qid, "")))
            if name in taken:  # drawn again from the names the question does not hold
                name = rng.choice([n for n in FIRST_NAMES if n not in taken])
            names[qid] = name
    return names
