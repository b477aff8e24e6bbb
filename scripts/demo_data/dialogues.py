"""Deterministic synthetic dialogue -> summary pairs (Korean + English) for the prompt/response demo.

``make_dialogues(n, seed=...)`` fills hand-written scenarios (a delayed order, a meeting to schedule, a
refund, a restaurant booking, weekend plans) with slot values; each summary is written from the same slots, so
it is learnable from the dialogue. About 40% of rows are Korean.

Lengths follow a real dialogue-summarization corpus: SAMSum's 16,369 messenger dialogues are spread uniformly
over 3-6, 7-12, 13-18 and 19-30 utterances (its dataset card), so each dialogue draws one of those bins, then
a count inside it (``UTTERANCE_BINS``). Beyond its scenario's lines a dialogue gets chat around it: small-talk
exchanges (nothing to summarize) and side topics (a moved meeting, a file to send, a lift...), each of which
adds a clause to the summary, so longer dialogues have longer summaries, as in SAMSum. As in ``synthetic``,
all randomness is integer draws from ``numpy.random.default_rng`` (same output on every machine, independent
of ``PYTHONHASHSEED``).

``write_demo_dialogues(path)`` writes ``{"dialogue": ..., "summary": ...}`` JSONL with a few dirty rows at
fixed positions (an empty summary, a missing dialogue, an exact duplicate) and returns what it wrote.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from demo_data.texts import SLOT, attach_particle

__all__ = ["UTTERANCE_BINS", "make_dialogues", "write_demo_dialogues"]

UTTERANCE_BINS = ((3, 6), (7, 12), (13, 18), (19, 30))  # SAMSum: a quarter of the dialogues in each

# fmt: off
_SLOTS = {
    "en": {
        "name": ("Alex", "Sam", "Jordan", "Taylor", "Chris", "Morgan", "Jamie", "Riley", "Casey", "Drew",
                 "Mina", "Daniel", "Grace", "Kevin", "Sophie", "Noah"),
        "product": ("laptop", "phone case", "coffee maker", "desk lamp", "pair of running shoes", "backpack",
                    "air fryer", "monitor", "keyboard", "winter jacket", "blender", "yoga mat"),
        "day": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
        "time": ("9 am", "10 am", "11:30 am", "1 pm", "2 pm", "3:30 pm", "5 pm", "6:30 pm", "7 pm"),
        "place": ("the regional hub", "customs", "the local depot", "the sorting center"),
        "venue": ("the cafe downstairs", "meeting room B", "the library", "the office lobby",
                  "the park entrance"),
        "project": ("budget", "marketing", "website", "hiring", "product launch", "training"),
        "thing": ("slides", "report", "contract draft", "sales figures", "timeline"),
        "reason": ("it arrived damaged", "it is the wrong size", "it stopped working after two days",
                   "the color is different from the photo"),
        "food": ("Italian", "Korean barbecue", "sushi", "Thai", "Mexican", "vegetarian"),
        "activity": ("go hiking", "see a movie", "visit the museum", "try the new bakery", "go cycling"),
        "count": ("two", "three", "four", "five", "six"),
    },
    "ko": {
        "name": ("민수", "지은", "서연", "도윤", "하준", "유진", "현우", "수빈", "지호", "예린", "태민",
                 "소희"),
        "product": ("노트북", "휴대폰 케이스", "커피 머신", "스탠드 조명", "운동화", "백팩", "에어프라이어",
                    "모니터", "키보드", "겨울 패딩", "믹서기", "요가 매트"),
        "day": ("월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일"),
        "time": ("오전 9시", "오전 10시", "오전 11시 반", "오후 1시", "오후 2시", "오후 3시 반", "오후 5시",
                 "저녁 7시"),
        "place": ("지역 물류센터", "세관", "동네 배송 거점", "분류 센터"),
        "venue": ("1층 카페", "B 회의실", "도서관", "회사 로비", "공원 입구"),
        "project": ("예산", "마케팅", "홈페이지", "채용", "신제품 출시", "교육"),
        "thing": ("발표 자료", "보고서", "계약서 초안", "매출 자료", "일정표"),
        "reason": ("배송 중에 파손되었다", "사이즈가 맞지 않는다", "이틀 만에 고장이 났다",
                   "사진과 색상이 다르다"),
        "food": ("이탈리아 음식", "고기집", "초밥", "태국 음식", "멕시코 음식", "채식 메뉴"),
        "activity": ("등산을 가기로", "영화를 보기로", "박물관에 가기로", "새로 생긴 빵집에 가기로",
                     "자전거를 타기로"),
        "count": ("두", "세", "네", "다섯", "여섯"),
    },
}

_SCENARIOS = {
    "en": (
        (["{a}: Hi, I ordered a {product} last {day} and it still hasn't arrived.",
          "{b}: Sorry about that. Could you give me the order number?",
          "{a}: Sure, it's {order}.",
          "{b}: Thanks. The package is held up at {place}. It should reach you by {day2}.",
          "{a}: OK, thanks for checking."],
         "{a}'s {product} order ({order}) is delayed at {place}; {b} says it should arrive by {day2}."),
        (["{a}: Are you free on {day} to go over the {project} plan?",
          "{b}: I'm busy in the morning, but {time} works for me.",
          "{a}: Great, let's meet at {venue} at {time}.",
          "{b}: Sounds good. I'll bring the {thing}."],
         "{a} and {b} will meet on {day} at {time} at {venue} to discuss the {project} plan; {b} will bring "
         "the {thing}."),
        (["{a}: I'd like to return the {product} I bought because {reason}.",
          "{b}: I'm sorry to hear that. Do you want a refund or an exchange?",
          "{a}: A refund, please.",
          "{b}: Done. The refund will reach your card within {count} business days."],
         "{a} returns the {product} because {reason}; {b} issues a refund that arrives within {count} "
         "business days."),
        (["{a}: Can I book a table for {count} on {day} evening?",
          "{b}: We have {time} or a bit later. Any preference for the menu?",
          "{a}: {time} is perfect, and we'd love the {food} set.",
          "{b}: Booked: a table for {count} at {time} on {day}, {food} set."],
         "{a} books a table for {count} at {time} on {day} and orders the {food} set."),
        (["{a}: Any plans for {day}?",
          "{b}: Not yet. Want to {activity}?",
          "{a}: Sure! Let's meet at {venue} at {time}.",
          "{b}: Perfect, see you there."],
         "{a} and {b} plan to {activity} on {day}, meeting at {venue} at {time}."),
    ),
    "ko": (
        (["{a}: 안녕하세요, 지난 {day}에 {product:을} 주문했는데 아직 안 왔어요.",
          "{b}: 불편을 드려 죄송합니다. 주문 번호를 알려 주시겠어요?",
          "{a}: 네, {order}입니다.",
          "{b}: 확인해 보니 {place}에서 지연되고 있어요. {day2}까지는 도착할 예정입니다.",
          "{a}: 알겠습니다, 감사합니다."],
         "{a}의 {product} 주문({order})이 {place}에서 지연되어 {day2}까지 도착할 예정이라고 {b:이} "
         "안내했다."),
        (["{a}: {day}에 {project} 계획 같이 검토할 수 있어요?",
          "{b}: 오전에는 바쁘고 {time:은} 괜찮아요.",
          "{a}: 좋아요, {time}에 {venue}에서 봬요.",
          "{b}: 네, {thing:은} 제가 챙겨 갈게요."],
         "{a:과} {b:은} {day} {time}에 {venue}에서 {project} 계획을 검토하기로 했고 {b:이} {thing:을} "
         "가져온다."),
        (["{a}: 구매한 {product:을} 반품하고 싶어요. {reason}고요.",
          "{b}: 죄송합니다. 환불과 교환 중 어떤 걸 원하세요?",
          "{a}: 환불해 주세요.",
          "{b}: 처리되었습니다. 영업일 기준 {count} 일 안에 카드로 환불됩니다."],
         "{a:은} {product:이} {reason}는 이유로 반품했고 {count} 영업일 안에 환불받는다."),
        (["{a}: {day} 저녁에 {count} 명 예약할 수 있을까요?",
          "{b}: {time}에 자리가 있어요. 메뉴는 정하셨어요?",
          "{a}: {time} 좋아요. {food} 코스로 할게요.",
          "{b}: {day} {time}, {count} 명, {food} 코스로 예약되었습니다."],
         "{a:은} {day} {time}에 {count} 명 자리를 {food} 코스로 예약했다."),
        (["{a}: {day}에 뭐 해?",
          "{b}: 아직 계획 없어. 같이 놀까?",
          "{a}: 좋아, 그럼 {activity} 하자. {time}에 {venue}에서 만나.",
          "{b}: 좋아, 그때 봐."],
         "{a:과} {b:은} {day}에 {activity} 했고 {time}에 {venue}에서 만난다."),
    ),
}

# Chat around the scenario. Small talk: (line, line) pairs that change nothing in the summary; the opener
# starts with speaker a (whose name every summary holds). Side topics: (line, line, summary clause).
_OPENER = {"en": ("{a}: Hey {b}, how's your week going?", "{b}: Busy, but good. You?"),
           "ko": ("{a}: {b} 씨, 이번 주 어떻게 지내요?", "{b}: 바쁘지만 괜찮아요. 그쪽은요?")}
_SMALL_TALK = {
    "en": (("{a}: Sorry, I was in a meeting all morning.", "{b}: No worries."),
           ("{b}: Is it still raining over there?", "{a}: Yes, all day. So annoying."),
           ("{a}: haha true", "{b}: :D"),
           ("{b}: Wait, one sec.", "{b}: OK, I'm back."),
           ("{a}: Did you sleep well? You looked tired yesterday.", "{b}: Much better today, thanks :)"),
           ("{a}: Btw, happy birthday to your sister!", "{b}: Thanks, I'll tell her!"),
           ("{b}: How was the trip last weekend?", "{a}: Great, but way too short.")),
    "ko": (("{a}: 미안해요, 오전 내내 회의였어요.", "{b}: 괜찮아요."),
           ("{b}: 거기 아직 비 와요?", "{a}: 네, 하루 종일 와요. 너무 귀찮아요."),
           ("{a}: ㅋㅋ 맞아요", "{b}: ㅎㅎ"),
           ("{b}: 잠깐만요.", "{b}: 네, 왔어요."),
           ("{a}: 어제 피곤해 보이던데 잘 잤어요?", "{b}: 오늘은 훨씬 나아요, 고마워요."),
           ("{a}: 참, 동생 생일 축하한다고 전해 주세요!", "{b}: 고마워요, 전할게요!"),
           ("{b}: 지난 주말 여행은 어땠어요?", "{a}: 좋았는데 너무 짧았어요.")),
}
_SIDE_TOPICS = {
    "en": (("{a}: By the way, the {project2} meeting moved to {day3}.",
            "{b}: Thanks for the heads-up, I'll be there.",
            "The {project2} meeting moved to {day3}."),
           ("{b}: Could you send me the {thing2} later?", "{a}: Sure, I'll send it tonight.",
            "{a} will send {b} the {thing2} tonight."),
           ("{a}: I'm thinking of buying a new {product2}. Any advice?",
            "{b}: Let's go and look at some on {day3}.",
            "{a} wants a new {product2}; {a} and {b} will look at some on {day3}."),
           ("{b}: Do you still need a ride to {venue2}?", "{a}: No, {c} is taking me, thanks.",
            "{c} is taking {a} to {venue2}."),
           ("{a}: Also, {c} says hi.", "{b}: Say hi back from me!", "{c} says hi to {b}."),
           ("{b}: Did you finish the {thing2}?", "{a}: Almost, I need one more day.",
            "{a} needs one more day for the {thing2}.")),
    "ko": (("{a}: 참, {project2} 회의가 {day3:으로} 바뀌었어요.", "{b}: 알려 줘서 고마워요, 참석할게요.",
            "{project2} 회의가 {day3:으로} 바뀌었다."),
           ("{b}: 이따 {thing2:을} 보내 줄 수 있어요?", "{a}: 네, 오늘 밤에 보낼게요.",
            "{a:이} 오늘 밤 {b}에게 {thing2:을} 보낸다."),
           ("{a}: 요즘 {product2:을} 새로 사려고 하는데 추천해 줄래요?", "{b}: {day3}에 같이 보러 가요.",
            "{a:과} {b:은} {day3}에 {product2:을} 보러 가기로 했다."),
           ("{b}: 아직 {venue2}까지 태워다 줄 사람 필요해요?",
            "{a}: 아니요, {c:이} 데려다주기로 했어요, 고마워요.",
            "{c:이} {a:을} {venue2}까지 데려다준다."),
           ("{a}: 참, {c:이} 안부 전해 달래요.", "{b}: 저도 안부 전해 주세요!",
            "{c:이} {b}에게 안부를 전했다."),
           ("{b}: {thing2} 다 끝냈어요?", "{a}: 거의요, 하루만 더 필요해요.",
            "{a:은} {thing2:을} 끝내려면 하루가 더 필요하다.")),
}
_CLOSING = {"en": ("{a}: Talk later!", "{b}: Bye!"), "ko": ("{a}: 이따 얘기해요!", "{b}: 네, 들어가세요!")}
# fmt: on


def make_dialogues(n: int, *, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows of ``{"dialogue", "summary"}``, about 40% Korean, utterance counts in SAMSum's bins
    (``UTTERANCE_BINS``); the same ``(n, seed)`` gives the same rows."""
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        lang = "ko" if rng.integers(0, 10) < 4 else "en"
        slots, scenarios = _SLOTS[lang], _SCENARIOS[lang]
        lines, summary = scenarios[int(rng.integers(0, len(scenarios)))]
        values = {key: options[int(rng.integers(0, len(options)))] for key, options in slots.items()}
        names = slots["name"]
        first = int(rng.integers(0, len(names)))
        values["a"] = names[first]
        values["b"] = names[(first + 1 + int(rng.integers(0, len(names) - 1))) % len(names)]
        values["c"] = next(
            str(name)
            for name in np.roll(names, -int(rng.integers(0, len(names))))
            if name not in (values["a"], values["b"])
        )
        values["day2"] = slots["day"][(slots["day"].index(values["day"]) + 2 + int(rng.integers(0, 3))) % 7]
        values["order"] = f"{'A' if lang == 'en' else 'K'}{int(rng.integers(100000, 1000000))}"
        for key in ("project", "thing", "product", "venue", "day"):  # the side topics' own values
            values[f"{key}3" if key == "day" else f"{key}2"] = slots[key][
                int(rng.integers(0, len(slots[key])))
            ]
        low, high = UTTERANCE_BINS[int(rng.integers(0, len(UTTERANCE_BINS)))]
        dialogue, clauses = _around(lang, list(lines), int(rng.integers(low, high + 1)) - len(lines), rng)
        rows.append(
            {
                "dialogue": "\n".join(_fill(line, values) for line in dialogue),
                "summary": " ".join(_fill(part, values) for part in (summary, *clauses)),
            }
        )
    return rows


def _around(lang: str, core: list[str], extra: int, rng) -> tuple[list[str], list[str]]:
    """``core`` with ``extra`` more lines of chat (an opener, side topics, small talk, a closing line) and the
    summary clauses of the side topics; side topics (a third of the pairs) never repeat, small talk cycles
    through its exchanges in a drawn order."""
    before, after, clauses = [], [], []
    sides = [int(i) for i in rng.permutation(len(_SIDE_TOPICS[lang]))]
    talk = [int(i) for i in rng.permutation(len(_SMALL_TALK[lang]))]
    pairs, single = divmod(max(0, extra), 2)
    for index in range(pairs):
        if index == 0 and rng.integers(0, 2):
            before.extend(_OPENER[lang])
        elif sides and rng.integers(0, 3) == 0:
            *lines, clause = _SIDE_TOPICS[lang][sides.pop()]
            after.extend(lines)
            clauses.append(clause)
        else:
            after.extend(_SMALL_TALK[lang][talk[0]])
            talk = talk[1:] + talk[:1]
    if single:
        after.append(_CLOSING[lang][int(rng.integers(0, 2))])
    return before + core + after, clauses


def _fill(template: str, values: dict[str, str]) -> str:
    """Slots ``{name}``, or ``{name:particle}`` for a Korean particle that follows the word's last sound."""
    return SLOT.sub(lambda m: attach_particle(values[m[1]], m[2]) if m[2] else values[m[1]], template)


def write_demo_dialogues(path: str | Path, *, n: int = 3_000, seed: int = 0) -> dict:
    """Write ``n`` rows (3 of them dirty on purpose) as JSONL; return the counts written."""
    rows: list[dict] = make_dialogues(n - 3, seed=seed)
    dirty = [
        ({"dialogue": rows[0]["dialogue"], "summary": ""}, "empty_summary"),
        ({"dialogue": None, "summary": rows[1]["summary"]}, "missing_dialogue"),
        (dict(rows[2]), "duplicate"),
    ]
    for offset, (row, _) in enumerate(dirty):
        rows.insert((offset + 1) * (len(rows) // 4), row)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8", newline="\n") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")
    korean = sum(1 for row in rows if row["summary"] and not row["summary"].isascii())
    return {"rows": len(rows), "korean_rows": korean, "dirty_rows": {reason: 1 for _, reason in dirty}}
