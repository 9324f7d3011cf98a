"""A tiny synthetic two-conversation dataset for the benchmark tests (no model, no file)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from bench.common.datasets import Conversation, Question, Turn

TOPICS = ("hiking", "painting", "cooking", "guitar", "chess", "gardening")
DETAILS = ("mountain", "river", "canvas", "violet", "pasta", "spice", "chord", "melody", "knight", "opening",
           "tulip", "compost")


def synthetic_conversations(n_conversations: int = 2) -> list[Conversation]:
    """Conversations of 4 dated sessions x 12 turns; each question names one turn's detail word.

    Every turn says ``"<speaker> loves <topic> with <detail> number <s><t>"``; the question for it
    asks ``"What does <speaker> love about <topic> <detail>?"``, so BM25, the hashing encoder and
    the token-overlap fake reranker can all find it, with distractors sharing topic words. Every
    third question asks only ``"Why <topic>?"`` (ambiguous); the last turn of each session has
    no label (not evaluated), and categories cycle through 1-5.
    """
    out = []
    for c in range(n_conversations):
        conv_id = f"conv-{c + 1}"
        turns, questions = [], []
        for s in range(4):
            when = datetime(2023, 1 + 2 * s, 5, 12, tzinfo=UTC) + timedelta(days=c)
            for t in range(12):
                speaker = ("Ana", "Ben")[t % 2] if c == 0 else ("Cy", "Di")[t % 2]
                topic = TOPICS[(s + t) % len(TOPICS)]
                detail = DETAILS[(3 * s + t) % len(DETAILS)]
                turn_id = f"D{s + 1}:{t + 1}"
                turns.append(Turn(turn_id, f"S{s + 1}", speaker, f"{speaker} loves {topic} with {detail} number {s}{t}",
                                  when))
                category = 1 + (t % 5)
                questions.append(
                    Question(
                        question_id=f"{conv_id}:{len(questions)}",
                        conversation_id=conv_id,
                        text=f"What does {speaker} love about {topic} {detail}?" if t % 3 else f"Why {topic}?",
                        relevant_turn_ids=frozenset({turn_id}) if t != 11 else frozenset(),
                        category=category,
                        question_date=None,
                    )
                )
        out.append(Conversation(conv_id, tuple(turns), tuple(questions)))
    return out


def test_synthetic_dataset_shape() -> None:
    convs = synthetic_conversations()
    assert [len(c.turns) for c in convs] == [48, 48]
    assert sum(1 for c in convs for q in c.questions if q.relevant_turn_ids) == 88
