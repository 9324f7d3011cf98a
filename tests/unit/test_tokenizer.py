"""The shared tokenizer: scripts without spaces, pointed Hebrew and Arabic, and English unchanged.

Each script test indexes a few turns of that script beside an English turn with an identifier and
asks BM25 (:class:`mnemos.bm25_index.BM25Index`, which the service and the benchmarks share) one
question: the intended turn must come first.
"""

from __future__ import annotations

import re
import unicodedata

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from mnemos.bm25_index import BM25Index
from mnemos.tokenizer import CJK_RANGES, tokenize

IDENTIFIER_TURN = "Maya: The plumber's invoice is INV-2024-0042, paid on Monday by bank transfer."


def _first(turns: list[str], query: str) -> str:
    index = BM25Index()
    texts = [*turns, IDENTIFIER_TURN, "Maya: the invoice for the roof was INV-2023-0917."]
    index.add(range(len(texts)), texts)
    results = index.search(query, 3)
    assert results, f"nothing found for {query!r}"
    return texts[results[0][0]]


CHINESE = ["小明: 我的猫叫小花，它今年三岁了。", "小明: 我弟弟在上海的一家银行工作。", "小明: 明天我们坐火车去北京旅行。",
           "小明: 我最喜欢的水果是芒果和荔枝。"]
JAPANESE = ["ゆき: 昨日は東京タワーに行きました。", "ゆき: 妹は大阪の病院で看護師をしています。",
            "ゆき: 週末にラーメンを作るのが好きです。", "ゆき: 来月、北海道へスキー旅行に行く予定です。"]
KOREAN = ["민수: 저는 서울에서 소프트웨어 개발자로 일해요.", "민수: 제 동생은 부산에 있는 대학교에 다녀요.",
          "민수: 주말마다 한강에서 자전거를 타요.", "민수: 어제 친구들이랑 김치찌개를 먹었어요."]
HEBREW = ["נועה: בְּרֵאשִׁית בָּרָא אֱלֹהִים אֵת הַשָּׁמַיִם וְאֵת הָאָרֶץ.", "נועה: מָה שְׁלוֹמְךָ הַיּוֹם, חָבֵר?",
          "נועה: הַכֶּלֶב שֶׁלִּי אוֹהֵב לָרוּץ בַּפַּארְק כָּל בֹּקֶר.", "נועה: אחותי גרה בחיפה ועובדת כמהנדסת."]
ARABIC = ["ليلى: بِسْمِ اللَّهِ الرَّحْمَٰنِ الرَّحِيمِ", "ليلى: أَهْلًا وَسَهْلًا، كَيْفَ حَالُكَ اليَوْمَ؟",
          "ليلى: يَعْمَلُ أَخِي مُهَنْدِسًا فِي شَرِكَةٍ كَبِيرَةٍ.", "ليلى: أختي تدرس الطب في جامعة القاهرة."]


@pytest.mark.parametrize(("turns", "query", "intended"), [
    # a word inside a sentence written without spaces
    (CHINESE, "猫叫什么名字？", CHINESE[0]),
    (CHINESE, "谁在上海工作", CHINESE[1]),
    (JAPANESE, "東京タワー", JAPANESE[0]),
    (JAPANESE, "大阪の病院", JAPANESE[1]),
    # Korean attaches particles: 서울에서 ("in Seoul") holds 서울
    (KOREAN, "서울", KOREAN[0]),
    (KOREAN, "부산 대학교", KOREAN[1]),
    # pointed and plain spellings are one word, and pointing never outranks an identifier
    (HEBREW, "איפה הכלב רץ?", HEBREW[2]),
    (HEBREW, "אֲחוֹתִי גָּרָה בְּחֵיפָה", HEBREW[3]),
    (HEBREW, "מָה הַמִּסְפָּר שֶׁל הַחֶשְׁבּוֹנִית INV-2024-0042?", IDENTIFIER_TURN),
    (ARABIC, "اخي يعمل مهندسا", ARABIC[2]),
    (ARABIC, "أُخْتِي تَدْرُسُ الطِّبَّ", ARABIC[3]),
    (ARABIC, "مَا هُوَ رَقْمُ الفَاتُورَةِ INV-2024-0042؟", IDENTIFIER_TURN),
    # Latin with identifiers: the exact identifier wins over its neighbour
    (CHINESE, "which invoice was INV-2024-0042?", IDENTIFIER_TURN),
    (JAPANESE, "INV-2024-0042の請求書", IDENTIFIER_TURN),
])
def test_a_query_per_script_finds_the_intended_turn(turns: list[str], query: str, intended: str) -> None:
    assert _first(turns, query) == intended


def test_cjk_runs_become_character_bigrams_and_other_letters_stay_whole():
    assert tokenize("我的猫叫小花") == ["我的", "的猫", "猫叫", "叫小", "小花"]
    assert tokenize("猫。狗") == ["猫", "狗"]  # a one-character run stays a unigram
    assert tokenize("iPhone手机 INV-2024-0042") == ["iphone", "手机", "inv", "2024", "0042"]
    assert tokenize("저는 서울에서") == ["저는", "서울", "울에", "에서"]
    assert tokenize("東京タワー") == ["東京", "京タ", "タワ", "ワー"]


def test_pointing_is_ignored_and_marks_stay_inside_their_word():
    assert tokenize("שָׁלוֹם עוֹלָם") == tokenize("שלום עולם") == ["שלום", "עולם"]
    assert tokenize("مُحَمَّد يَكْتُبُ") == tokenize("محمد يكتب") == ["محمد", "يكتب"]
    assert tokenize("الكـــتاب") == ["الكتاب"]  # tatweel only stretches the line
    assert tokenize("हिन्दी भाषा") == ["हिन्दी", "भाषा"]  # Devanagari vowel signs are part of the word
    assert tokenize("1\ufe0f\u20e3 \u2764\ufe0f") == ["1"]  # emoji selectors and keycaps are not words
    assert tokenize("İstanbul") == tokenize("istanbul") == ["istanbul"]  # not "i", "stanbul"


# LoCoMo-style English (speaker, curly apostrophes, emoji, accents, numbers, a hyphenated id): the tokens the
# regex tokenizer of the source gave, written out, so any change to English tokenization fails here.
ENGLISH = {
    "Caroline: Hey Mel! Good to see you! How have you been?":
        ["caroline", "hey", "mel", "good", "to", "see", "you", "how", "have", "you", "been"],
    "Melanie: I\u2019m swamped with the kids & work \U0001F605 but I went to a LGBTQ support group yesterday.":
        ["melanie", "i", "m", "swamped", "with", "the", "kids", "work", "but", "i", "went", "to", "a", "lgbtq",
         "support", "group", "yesterday"],
    "Caroline: It was on 7 May 2023 \u2014 the caf\u00e9 on 5th St. (room B-12), at 3:30pm!":
        ["caroline", "it", "was", "on", "7", "may", "2023", "the", "café", "on", "5th", "st", "room", "b", "12", "at",
         "3", "30pm"],
    "Melanie: \u201cCharlotte\u2019s Web\u201d is my kids\u2019 favourite; ticket_id=INV-2024-0042.":
        ["melanie", "charlotte", "s", "web", "is", "my", "kids", "favourite", "ticket_id", "inv", "2024", "0042"],
    "Caroline: [image: a photo of a rainbow flag at the Pride parade]":
        ["caroline", "image", "a", "photo", "of", "a", "rainbow", "flag", "at", "the", "pride", "parade"],
}


@pytest.mark.parametrize("text", list(ENGLISH))
def test_english_tokens_are_unchanged(text: str) -> None:
    assert tokenize(text) == ENGLISH[text]


def _source_tokenizer(text: str) -> list[str]:
    """The tokenizer before scripts without spaces were handled: NFC, casefold, ``\\w+``."""
    return re.findall(r"\w+", unicodedata.normalize("NFC", text).casefold())


_TEXT = st.text(st.characters(
    codec="utf-8", categories=("Lu", "Ll", "Lt", "Lo", "Nd", "Po", "Ps", "Pe", "Pd", "Zs", "Sm", "Sc", "So"),
    max_codepoint=0x2BFF), max_size=80)


@settings(max_examples=400, deadline=None)
@given(_TEXT)
def test_text_without_cjk_or_marks_tokenizes_as_before(text: str) -> None:
    folded = unicodedata.normalize("NFC", text).casefold()
    assume(not any(unicodedata.category(ch).startswith("M") for ch in folded))  # folding may add a mark
    assume(not any(lo <= ord(ch) <= hi for ch in folded for lo, hi in CJK_RANGES))
    assert tokenize(text) == _source_tokenizer(text)


def test_text_must_be_a_string():
    with pytest.raises(TypeError):
        tokenize(b"bytes")  # type: ignore[arg-type]
