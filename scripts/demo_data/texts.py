"""Deterministic synthetic text corpora (Korean + English), standard library and numpy only.

``make_texts(n, seed=..., profile=...)`` builds texts from hand-written word lists and sentence
templates: user reviews, chat messages, product Q&A and news-like sentences. The same ``(n, seed,
profile)`` gives the same list on every run and machine: all randomness comes from
``numpy.random.default_rng`` drawing integers only (no float rounding can differ between
platforms), and nothing depends on the iteration order of sets or on ``PYTHONHASHSEED``.

Profiles:

* ``"demo"``: the embedded demo corpus, about 40% Korean, median 30-60 characters, a long tail and
  about 0.5% long texts of 800-1,400 characters; short texts repeat now and then (1-2% duplicates).
* ``"short"``: benchmark texts, mostly one sentence, mean about 40 characters; fast enough for
  millions of rows.
* ``"reviews"``: review-like texts, median about 27 characters, tail to about 150, about 1% of
  500-2,000 characters.

``write_demo_corpus(path)`` writes the demo profile as JSONL (``{"text": ...}`` per line) with
dirty rows mixed in at deterministic positions (empty, whitespace-only, exact duplicates, non-strings,
whitespace/Unicode-normalization variants) and returns what it wrote.
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = ["PROFILES", "demo_rows", "make_texts", "write_demo_corpus"]

# --------------------------------------------------------------------------------------------------
# Vocabulary. Slot names in templates refer to these lists; order matters (earlier = more frequent).
# --------------------------------------------------------------------------------------------------

# fmt: off
_EN_WORDS: dict[str, tuple[str, ...]] = {
    "product": (
        "phone", "laptop", "tablet", "charger", "charging cable", "power bank", "phone case",
        "screen protector", "keyboard", "mouse", "monitor", "webcam", "headphones", "earbuds",
        "speaker", "smartwatch", "fitness tracker", "camera", "tripod", "backpack", "suitcase",
        "wallet", "jacket", "hoodie", "raincoat", "sneakers", "running shoes", "boots", "jeans",
        "T-shirt", "dress", "scarf", "blender", "coffee maker", "kettle", "toaster", "air fryer",
        "rice cooker", "frying pan", "knife set", "cutting board", "water bottle", "lunch box",
        "desk lamp", "office chair", "standing desk", "bookshelf", "mattress", "pillow", "blanket",
        "towel set", "vacuum cleaner", "air purifier", "humidifier", "fan", "space heater",
        "hair dryer", "electric toothbrush", "shampoo", "face cream", "sunscreen", "yoga mat",
        "dumbbell set", "bike helmet", "tent", "sleeping bag", "board game", "jigsaw puzzle",
        "dog bed", "litter box", "stroller", "printer", "router", "hard drive",
    ),
    "feature": (
        "battery", "battery life", "screen", "display", "sound quality", "sound", "build quality",
        "price", "packaging", "color", "size", "fit", "material", "fabric", "stitching", "design",
        "weight", "smell", "texture", "grip", "zipper", "strap", "handle", "lid", "power button",
        "cable", "charging speed", "noise level", "suction", "heat", "manual", "app", "setup",
        "Bluetooth connection", "camera quality", "customer service", "delivery", "return process",
        "warranty", "cushioning",
    ),
    "adj_pos": (
        "great", "good", "excellent", "amazing", "awesome", "solid", "sturdy", "lightweight",
        "comfortable", "reliable", "durable", "gorgeous", "beautiful", "perfect", "fantastic",
        "impressive", "decent", "nice", "lovely", "cozy", "sleek", "compact", "quiet", "powerful",
        "smooth", "soft", "bright", "crisp", "clear", "fast", "well made", "easy to use", "cute",
        "handy", "stylish", "practical",
    ),
    "adj_neg": (
        "flimsy", "noisy", "cheap", "disappointing", "broken", "useless", "overpriced", "too small",
        "too big", "too heavy", "loud", "slow", "dim", "blurry", "scratchy", "stiff",
        "uncomfortable", "fragile", "unreliable", "confusing", "faulty", "dented", "wobbly", "sticky",
        "leaky", "smelly", "weak", "laggy", "buggy", "awkward",
    ),
    "adv": (
        "really", "very", "pretty", "super", "quite", "extremely", "surprisingly", "incredibly",
        "fairly", "totally", "honestly", "absolutely", "so",
    ),
    "person": (
        "my wife", "my husband", "my son", "my daughter", "my mom", "my dad", "my sister",
        "my brother", "my girlfriend", "my boyfriend", "my roommate", "my coworker", "my boss",
        "a friend", "my best friend", "my grandma", "my kids", "my nephew", "my neighbor",
        "my partner",
    ),
    "time": (
        "yesterday", "last week", "this morning", "two days ago", "last month", "on Monday",
        "over the weekend", "a few days ago", "three weeks ago", "last night", "today",
        "earlier this year",
    ),
    "duration": (
        "two weeks", "a month", "three months", "six months", "a year", "a few days", "ten days",
        "two years", "a couple of weeks", "a week",
    ),
    "price": (
        "$19.99", "$29", "$9.99", "$49.99", "$12", "$15.50", "$24.99", "$35", "$39.99", "$59",
        "$79.99", "$99", "$120", "$149.99", "$199", "$249", "$299",
    ),
    "rating": ("5 stars", "4 stars", "3 stars", "2 stars", "1 star", "five stars", "four stars"),
    "percent": (
        "2%", "3.5%", "1.2%", "0.5%", "5%", "0.25%", "4%", "7%", "10%", "12%", "15%", "20%", "30%",
    ),
    "city": (
        "Seoul", "Busan", "London", "New York", "Tokyo", "Incheon", "Osaka", "Paris", "Berlin",
        "Madrid", "Rome", "Chicago", "Boston", "Seattle", "Austin", "Denver", "Toronto", "Vancouver",
        "Sydney", "Melbourne", "Singapore", "Dubai", "Mumbai", "Jakarta", "Mexico City",
        "São Paulo",
    ),
    "org": (
        "the city council", "the central bank", "the government", "local officials", "the ministry",
        "researchers", "the company", "the school board", "the health department",
        "the transport authority", "lawmakers", "the mayor's office", "the weather service",
        "analysts", "the union", "the police", "the court", "the regulator", "scientists",
        "the university",
    ),
    "topic": (
        "interest rates", "housing prices", "public transit fares", "the new stadium",
        "a new bike lane", "the minimum wage", "school lunches", "electricity prices", "the budget",
        "a new subway line", "air quality", "water prices", "rent controls", "the tax plan",
        "the heat wave", "flood defenses", "the new airport", "a four-day work week",
        "the recycling program", "the city marathon",
    ),
    "verb_news": (
        "announced", "approved", "delayed", "rejected", "proposed", "postponed", "confirmed",
        "unveiled", "criticized", "welcomed", "reviewed", "expanded", "suspended", "defended",
    ),
    "change": ("rose", "fell", "climbed", "dropped", "jumped", "slipped", "edged up", "edged down"),
    "change_inf": ("rise", "fall", "stabilize", "recover", "slow down", "pick up"),
    "metric": (
        "inflation", "unemployment", "exports", "retail sales", "home sales", "consumer spending",
        "factory output", "tourism", "ticket sales", "online orders",
    ),
    "year": ("2025", "2026", "next year", "the end of the year", "2024", "the spring"),
    "event": (
        "festival", "marathon", "concert", "parade", "trade fair", "book fair", "film festival",
        "night market",
    ),
    "weather": ("heavy rain", "strong winds", "the heat wave", "snow", "the storm warning", "fog"),
    "count": ("3,000", "12,000", "50,000", "200,000", "1.2 million", "two million", "800"),
    "quote": (
        "We are listening to residents.", "No decision has been made yet.", "We will act quickly.",
        "The situation is under control.", "More details will follow next week.",
        "This is a big step forward.",
    ),
    "date": ("January 1", "March 15", "July 1", "next Monday", "October 1", "April 30"),
    "weekday": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "day": (
        "tomorrow", "tonight", "this weekend", "on Friday", "next week", "after work",
        "after lunch", "on Saturday", "Sunday morning", "later today", "friday night", "on Monday",
    ),
    "food": (
        "pizza", "ramen", "sushi", "tacos", "burgers", "fried chicken", "pho", "curry", "pasta",
        "bibimbap", "dumplings", "Korean barbecue", "salad", "noodles", "sandwiches", "ice cream",
        "bubble tea", "kimchi stew", "tteokbokki", "dim sum",
    ),
    "activity": (
        "go hiking", "watch a movie", "grab coffee", "get lunch", "play games", "go shopping",
        "hit the gym", "go for a run", "study together", "go to the beach", "see the concert",
        "try that new place",
    ),
    "place_local": (
        "the station", "the mall", "the park", "the library", "the cafe downstairs", "the office",
        "the gym", "my place", "your place", "the usual spot", "the bus stop", "the lobby",
    ),
    "greeting": ("Hey", "Hi", "Hey guys", "Yo", "Morning", "Hello", "Ok so", "Quick question"),
    "reaction": ("lol", "haha", ":)", "😂", "👍", "!!", "omg", "🙏", ":(", "lmao", "❤️", "xD"),
    "accessory": (
        "case", "charger", "manual", "carrying bag", "spare battery", "remote", "cable", "adapter",
        "warranty card", "spare filter", "stand", "cover",
    ),
    "color": (
        "black", "white", "navy", "beige", "gray", "pink", "mint green", "red", "olive", "cream",
    ),
    "size": ("small", "medium", "large", "XL", "size 8", "size 10"),
    "platform": ("iPhone", "Android", "Windows", "Mac", "a 220V outlet", "USB-C chargers"),
    "warranty": ("one year", "two years", "six months", "90 days"),
    "restock": ("next week", "on Friday", "this weekend", "in two weeks", "early next month"),
    "ndays": ("two days", "three days", "a week", "ten days", "over two weeks", "one day"),
    "box_state": ("perfect", "dented", "fine", "soaked", "torn open", "crushed"),
    "ordinal": ("second", "third", "fourth", "fifth"),
    "fit_advice": (
        "runs a bit small, so size up", "runs large, so size down", "fits true to size",
        "is a little tight around the shoulders",
    ),
    "minutes": ("five minutes", "10 minutes", "15 minutes", "20 minutes", "half an hour", "an hour"),
    "item": (
        "keys", "charger", "umbrella", "wallet", "headphones", "jacket", "water bottle", "notebook",
    ),
    "chat_adj": ("hilarious", "so fun", "wild", "amazing", "so bad", "crazy", "the best", "a mess"),
    "delay": (
        "bus is late", "subway is packed", "traffic is terrible", "train got cancelled", "roads are icy",
    ),
    "apparel": (
        "jacket", "hoodie", "raincoat", "sneakers", "running shoes", "boots", "jeans", "T-shirt",
        "dress", "sweater", "coat", "shorts", "leggings", "sandals",
    ),
    "company": (
        "the carmaker", "the chipmaker", "the airline", "the retailer", "the bank", "the game studio",
        "the food delivery app", "the steelmaker",
    ),
    "news_event": (
        "announcement", "earnings report", "product launch", "merger news", "CEO's resignation",
        "recall",
    ),
    "chat_state": ("so tired", "starving", "soaked from the rain", "finally", "exhausted", "happy"),
    "work": ("report", "slides", "homework", "essay", "budget sheet", "presentation"),
    "doc": ("photos", "address", "link", "file", "notes", "tickets"),
    "clock": ("7", "6:30", "6", "7:30", "noon", "3pm", "8pm"),
    "name": (
        "Sam", "Alex", "Jordan", "Mina", "Jisoo", "Chris", "Taylor", "Emma", "Noah", "Liam",
        "Olivia", "Minjun", "Seoyeon", "Daniel", "Grace",
    ),
}

_KO_WORDS: dict[str, tuple[str, ...]] = {
    "product": (
        "휴대폰", "노트북", "태블릿", "충전기", "충전 케이블", "보조배터리", "휴대폰 케이스", "보호필름",
        "키보드", "마우스", "모니터", "웹캠", "헤드폰", "무선 이어폰", "블루투스 스피커", "스마트워치",
        "카메라", "삼각대", "백팩", "캐리어", "지갑", "패딩", "후드티", "우산", "운동화", "부츠",
        "청바지", "티셔츠", "원피스", "목도리", "믹서기", "커피머신", "전기포트", "토스터",
        "에어프라이어", "전기밥솥", "프라이팬", "식칼", "도마", "텀블러", "도시락통", "스탠드",
        "사무용 의자", "책상", "책장", "매트리스", "베개", "이불", "수건", "무선 청소기", "공기청정기",
        "가습기", "선풍기", "전기히터", "드라이기", "전동칫솔", "샴푸", "수분크림", "선크림", "요가매트",
        "아령", "자전거 헬멧", "텐트", "침낭", "보드게임", "퍼즐", "강아지 방석", "유모차", "프린터",
        "공유기", "외장하드",
    ),
    "feature": (
        "배송", "가격", "배터리", "화면", "음질", "소리", "마감", "포장", "색상", "색깔", "사이즈", "핏",
        "재질", "원단", "바느질", "디자인", "무게", "냄새", "맛", "촉감", "그립감", "지퍼", "손잡이",
        "뚜껑", "버튼", "충전 속도", "소음", "흡입력", "설명서", "앱", "설치", "블루투스 연결",
        "카메라 화질", "고객센터", "반품 절차", "품질", "착용감", "내구성", "발열", "화질",
    ),
    "pred_pos": (
        "좋아요", "만족스러워요", "괜찮아요", "마음에 들어요", "최고예요", "훌륭해요", "깔끔해요",
        "튼튼해요", "가벼워요", "편해요", "예뻐요", "부드러워요", "조용해요", "빨라요", "선명해요",
        "딱 좋아요", "기대 이상이에요", "만족해요", "고급스러워요", "무난해요",
    ),
    "pred_neg": (
        "별로예요", "아쉬워요", "불편해요", "무거워요", "시끄러워요", "느려요", "약해요", "작아요",
        "커요", "애매해요", "실망스러워요", "허술해요", "뻑뻑해요", "답답해요", "약하네요",
    ),
    "adv": (
        "정말", "너무", "진짜", "완전", "꽤", "생각보다", "아주", "엄청", "되게", "은근히", "확실히",
        "상당히",
    ),
    "person": (
        "엄마", "아빠", "남편", "아내", "친구", "동생", "언니", "오빠", "누나", "형", "아들", "딸",
        "회사 동료", "부모님", "할머니", "남자친구", "여자친구", "룸메이트", "팀장님", "이웃",
    ),
    "time": (
        "어제", "오늘 아침", "지난주", "이틀 전", "주말에", "지난달", "며칠 전", "어젯밤", "오늘",
        "월요일에", "얼마 전", "작년에",
    ),
    "duration": ("일주일", "2주", "한 달", "세 달", "반년", "1년", "며칠", "열흘", "2년", "보름"),
    "price": (
        "2만 원", "19,900원", "9,900원", "3만 원", "12,000원", "15,800원", "25,000원", "39,000원",
        "4만 9천 원", "5만 원", "7만 원", "9만 9천 원", "12만 원", "15만 원", "20만 원",
    ),
    "percent": ("2%", "3.5%", "1.2%", "0.5%", "5%", "0.25%", "4%", "7%", "10%", "12%", "15%", "20%"),
    "city": (
        "서울", "부산", "인천", "대구", "대전", "광주", "울산", "세종", "수원", "제주", "강릉", "전주",
        "춘천", "포항", "창원", "성남", "고양", "용인",
    ),
    "org": (
        "정부", "서울시", "시청", "한국은행", "교육부", "국토교통부", "보건복지부", "기상청", "경찰",
        "연구진", "국회", "법원", "금융위원회", "노조", "회사 측", "대학 연구팀", "소방당국", "환경부",
    ),
    "topic": (
        "금리", "집값", "대중교통 요금", "최저임금", "전기요금", "미세먼지 대책", "신규 지하철 노선",
        "예산안", "청년 주거 지원", "저출산 대책", "전세 사기 대책", "폭염 대책", "재활용 제도",
        "주 4일제", "신공항 건설", "수도요금", "학교 급식", "관광 활성화 방안",
    ),
    "verb_news": (
        "발표했다", "승인했다", "연기했다", "거부했다", "제안했다", "확정했다", "공개했다", "비판했다",
        "환영했다", "검토하고 있다", "확대하기로 했다", "중단했다",
    ),
    "metric": (
        "물가", "실업률", "수출", "소매 판매", "주택 거래량", "소비 지출", "산업 생산", "관광객 수",
        "온라인 주문", "가계 대출",
    ),
    "change": ("올랐다", "떨어졌다", "증가했다", "감소했다", "상승했다", "하락했다", "소폭 올랐다",
               "소폭 내렸다"),
    "weather": ("폭우", "폭설", "강풍", "폭염", "한파", "미세먼지", "짙은 안개"),
    "year": ("올해", "내년", "2025년", "2026년", "2027년"),
    "quote": (
        "시민들의 의견을 충분히 듣겠다", "아직 정해진 것은 없다", "최대한 빨리 대책을 마련하겠다",
        "상황을 예의주시하고 있다", "다음 주에 자세한 내용을 공개하겠다", "큰 진전이라고 본다",
    ),
    "count": ("3만", "12만", "50만", "200만", "1천", "5천", "800"),
    "event": ("축제", "마라톤 대회", "콘서트", "불꽃놀이", "박람회", "영화제", "야시장"),
    "food": (
        "김치찌개", "된장찌개", "떡볶이", "치킨", "피자", "라면", "삼겹살", "비빔밥", "냉면", "짜장면",
        "짬뽕", "초밥", "햄버거", "파스타", "국밥", "족발", "마라탕", "순대", "돈까스", "샐러드",
    ),
    "activity": (
        "영화 보러", "커피 마시러", "밥 먹으러", "쇼핑하러", "운동하러", "산책하러", "등산하러",
        "바다 보러", "전시회 보러", "공부하러", "드라이브하러", "맛집 탐방하러",
    ),
    "place_local": (
        "강남역", "홍대입구역", "회사 앞", "집 앞", "카페", "도서관", "헬스장", "편의점", "지하철역",
        "버스 정류장", "로비", "공원",
    ),
    "day": (
        "내일", "오늘 저녁", "이번 주말에", "금요일에", "다음 주에", "퇴근하고", "점심때", "토요일에",
        "일요일 오전에", "이따가", "금요일 밤에", "월요일에",
    ),
    "clock": ("7시", "6시 반", "6시", "7시 반", "12시", "오후 3시", "저녁 8시"),
    "minutes": ("5분", "10분", "15분", "20분", "30분", "한 시간"),
    "reaction": ("ㅋㅋ", "ㅋㅋㅋ", "ㅎㅎ", "ㅠㅠ", "ㅜㅜ", "^^", "👍", "😂", "!!", "ㅋㅋㅋㅋ", "🙏", "ㄷㄷ"),
    "greeting": ("야", "얘들아", "안녕", "혹시", "저기", "있잖아", "다들", "자기야"),
    "accessory": (
        "케이스", "충전기", "설명서", "파우치", "여분 배터리", "리모컨", "케이블", "어댑터", "보증서",
        "필터", "거치대", "커버",
    ),
    "color": ("블랙", "화이트", "네이비", "베이지", "그레이", "핑크", "민트", "레드", "카키", "아이보리"),
    "size": ("S", "M", "L", "XL", "230", "240", "250", "260", "270"),
    "ndays": ("1~2일", "2~3일", "3일", "5일", "일주일"),
    "warranty": ("6개월", "1년", "2년", "3년"),
    "restock": ("다음 주", "이번 주 금요일", "이번 주말", "2주 뒤", "다음 달 초"),
    "ordinal": ("두 번째", "세 번째", "네 번째", "다섯 번째"),
    "item": ("열쇠", "충전기", "우산", "지갑", "이어폰", "겉옷", "텀블러", "노트"),
    "work": ("보고서", "발표 자료", "과제", "기획서", "회의록", "예산표"),
    "doc": ("사진", "주소", "링크", "파일", "메모", "티켓"),
    "name": ("민수", "지수", "서연", "민준", "하은", "도윤", "수빈", "지훈", "유진", "현우"),
    "chat_state": ("너무 피곤해", "배고파 죽겠어", "비 맞아서 다 젖었어", "드디어 끝났다", "완전 지쳤어"),
    "delay": ("버스가 안 와서", "차가 막혀서", "지하철을 놓쳐서", "길을 잘못 들어서", "회의가 늦게 끝나서"),
    "apparel": (
        "패딩", "후드티", "바람막이", "운동화", "러닝화", "부츠", "청바지", "티셔츠", "원피스", "니트",
        "코트", "반바지", "레깅스", "샌들",
    ),
}

# --------------------------------------------------------------------------------------------------
# Templates. ``{slot}`` draws a word; ``{slot:이}`` (Korean) appends the particle that fits the word's
# final consonant (이/가, 은/는, 을/를, 과/와, 으로/로, 이랑/랑, 이에요/예요).
# Each kind has "first" templates (the opening sentence) and "rest" (following sentences).
# --------------------------------------------------------------------------------------------------

_EN_TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "canned": {
        "first": (
            "Great product!", "Love it!", "Works great.", "Highly recommend.", "Fast shipping.",
            "Five stars.", "Not bad.", "Good value for money.", "Exactly as described.",
            "Would buy again.", "Terrible.", "Do not buy.", "Thanks!", "ok", "lol", "Sounds good!",
            "See you soon.", "On my way.", "Running late, sorry!", "Happy birthday!!", "Congrats!",
            "Good morning!", "Thank you so much!", "Perfect fit.", "Meh.", "Returned it.",
            "Arrived broken.", "Worth it.", "Super cute!", "My kids love it.", "Does the job.",
            "As expected.", "Good quality.", "Nice.", "Awesome!", "Not as pictured.", "Too small.",
            "Love the color!", "Quick delivery, thanks.", "See you tomorrow!", "Can't wait!",
            "What time?", "Where are you?", "Call me when you can.", "👍", "haha yes", "No worries!",
            "Got it, thanks.", "Same here.", "Great product, fast shipping!",
        ),
    },
    "review_short": {
        "first": (
            "{adv} {adj_pos} {product}!", "{adj_pos} {product}, {adj_pos} price.",
            "The {feature} is {adv} {adj_pos}.", "{rating}. {adj_pos} {feature}.",
            "{feature} could be better, but the {feature} is {adj_pos}.",
            "Love this {product}, the {feature} is {adj_pos}!",
            "{adj_neg} {feature}, otherwise a {adj_pos} {product}.",
            "{adj_pos} {product}, worth it for {price}.",
            "The {feature} on this {product} is kinda {adj_neg} tbh.",
            "{adv} {adj_neg} {product}. Returned it.",
            "Nice {color} {product}, {adv} {adj_pos}.", "Arrived in {ndays}, {adj_pos} {product}!",
            "{adv} {adj_pos} {feature} {reaction}", "{rating}, {adv} {adj_pos} {product}.",
            "My {product} is {adv} {adj_neg}.",
        ),
    },
    "review": {
        "first": (
            "I bought this {product} {time} and it's {adv} {adj_pos}.",
            "The {feature} is {adv} {adj_pos}, but the {feature} is a bit {adj_neg}.",
            "Got this {product} for {person} and they love the {feature}.",
            "After {duration} of daily use, the {feature} is still {adj_pos}.",
            "For {price}, you can't beat this {adj_pos} {product}.",
            "Honestly the {feature} of the {product} could be better, it feels {adj_neg}.",
            "Shipping took {ndays} and the box was {box_state}, but the {product} is {adj_pos}.",
            "This is my {ordinal} {product} from this brand, the {feature} is always {adj_pos}.",
            "I'd give it {rating} because the {feature} is {adj_neg}.",
            "Compared to my old {product}, this one is {adv} {adj_pos}.",
            "The {product} stopped working after {duration}, and the {feature} was already {adj_neg}.",
            "{adv} {adj_pos} {product}, would recommend to anyone.",
            "Not sure why people complain about the {feature}, mine is {adj_pos}.",
            "Customer service replaced my {product} within {ndays} after the {feature} broke.",
            "The {product} is {adj_pos} for the price, just don't expect miracles.",
            "The {color} {product} looks even better in person, {adv} {adj_pos}.",
            "Heads up: the {color} {apparel} {fit_advice}, I got one for {person}.",
            "Setup of the {product} took about {minutes} and the app is {adv} {adj_pos}.",
            "Wish the {feature} on the {product} was a little less {adj_neg}.",
            "I use the {product} every day and the {feature} is {adv} {adj_pos}.",
            "{person} borrowed my {product} and now wants one too.",
            "Paid {price} {time} and it already feels {adj_neg}.",
        ),
    },
    "chat": {
        "first": (
            "{greeting} {name}, want to {activity} {day}?",
            "I'm at {place_local} with {person} until {clock}, where are you?",
            "Sorry {name}, running {minutes} late, the {delay} {reaction}",
            "Can we do {food} {day} with {person}? {reaction}",
            "{greeting}, did anyone see my {item}? I think I left it at {place_local} {time}.",
            "Meet at {place_local} at {clock} {day}? {reaction}",
            "lol the {event} {time} was {chat_adj} {reaction}",
            "Just got back from {place_local} with {person}, {chat_state} {reaction}",
            "{person} says the new {food} place is {adj_pos}.",
            "{name}, did you finish the {work}? It's due {day} {reaction}",
            "Ok {name}, see you at {place_local} at {clock} {reaction}",
            "{name}, can you send me the {doc} for the {work} before {clock}?",
            "{greeting}, I think I left my {item} at {place_local} {time}.",
            "Happy birthday {name}!! Let's get {food} {day} {reaction}",
            "{name}, are you coming to the {event} with {person} {day}?",
            "Craving {food} so bad, anyone free {day}? {reaction}",
        ),
    },
    "qa": {
        "first": (
            "Does the {product} come with a {accessory}?",
            "Is the {color} {apparel} still available in {size}?",
            "How long does shipping of the {product} to {city} usually take?",
            "Can I machine wash the {color} {apparel}, or will the {feature} get {adj_neg}?",
            "Is the {feature} of the {product} good enough for daily use?",
            "Does this {product} work with {platform}?",
            "What is the warranty on the {product} if the {feature} breaks?",
            "Is the {product} {adj_pos} enough for travel?",
        ),
        "rest": (
            "Yes, a {accessory} is included in the box.", "It usually ships within {ndays}.",
            "The warranty covers {warranty}.", "We recommend hand washing only.",
            "Thanks for your question!", "According to the seller, it works with {platform}.",
            "Mine works fine with {platform}, no issues so far.",
            "Please contact our support team for details.", "I had the same question, the answer is yes.",
            "The {color} {apparel} is back in stock {restock}.",
        ),
    },
    "news": {
        "first": (
            "{org} {verb_news} a plan to change {topic} {time}.",
            "{metric} in {city} {change} {percent} from a year earlier.",
            "According to {org}, {topic} will remain a major issue through {year}.",
            "Officials in {city} said the {event} would go ahead despite {weather}.",
            "{org} {verb_news} the proposal on {topic} after a long debate.",
            "The decision by {org} affects about {count} residents in {city}.",
            "Analysts expect {metric} in {city} to {change_inf} in the coming months.",
            'Asked about {topic}, a spokesperson for {org} said: "{quote}"',
            "Residents in {city} have complained to {org} about {topic} for years.",
            "Schools in {city} will close early on {weekday} due to {weather}.",
            "The new rules on {topic} in {city} take effect on {date}.",
            "Shares of {company} {change} {percent} after the {news_event}.",
        ),
    },
}

_KO_TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "canned": {
        "first": (
            "배송 빨라요", "좋아요", "완전 만족해요!", "잘 받았습니다", "추천합니다", "재구매 의사 있어요",
            "가성비 최고", "별로예요", "생각보다 작아요", "색이 예뻐요", "감사합니다!", "ㅋㅋㅋㅋ", "ㅇㅋ",
            "알겠어", "지금 가는 중", "좀 늦을 듯ㅠ", "생일 축하해!!", "고마워~", "굿굿", "대박",
            "괜찮네요", "튼튼해요", "배송이 좀 늦었어요", "사진이랑 똑같아요", "사이즈 딱 맞아요",
            "포장이 꼼꼼해요", "냄새가 좀 나요", "반품했어요", "아이가 좋아해요", "최고예요 👍",
            "그냥 그래요", "무난해요", "또 살게요", "선물용으로 좋아요", "내일 봐!", "어디야?",
            "밥 먹었어?", "잘 자~", "수고하셨습니다", "넵 알겠습니다",
        ),
    },
    "review_short": {
        "first": (
            "{product} {feature:이} {pred_pos}", "{adv} {pred_pos} {reaction}",
            "{product} {feature:은} {pred_neg}",
            "{product} {adv} {pred_pos}", "{product} {price}에 이 정도면 만족 {reaction}",
            "{feature} {adv} {pred_pos} {reaction}", "{product} {feature:이} 좀 {pred_neg}",
            "{product} {color} 색상 {adv} 예뻐요", "{person:이} {product} {duration}째 잘 쓰고 있어요",
            "{feature:은} {pred_pos}. {feature:은} {pred_neg}.",
            "배송 {ndays} 걸렸어요. {feature:은} {pred_pos}",
            "{person:이} {product} {adv} 좋아해요", "{product} {feature} 때문에 별 하나 뺐어요",
            "{feature:이} {adv} {pred_neg} {reaction}",
        ),
    },
    "review": {
        "first": (
            "{product} {time} 받았는데 {adv} {pred_pos}.",
            "{feature:이} {adv} {pred_pos}.",
            "{feature:은} {pred_pos}, 근데 {feature:이} 좀 {pred_neg}.",
            "{person} 선물로 {product} 샀는데 {adv} 좋아해요.",
            "{duration} 정도 써봤는데 {feature:이} {pred_pos}.",
            "{product} {price} 주고 샀는데 가성비 {adv} 좋네요.",
            "배송은 {adv} 빨랐고 {feature:도} {pred_pos}.",
            "{product:은} {adv} {pred_pos}. 재구매 의사 있어요.",
            "{feature:이} 생각보다 {pred_neg}. 그래도 {price}에 이 정도면 괜찮아요.",
            "{product} 처음 써보는데 {feature:이} {adv} {pred_pos}.",
            "{product} {feature} 때문에 결국 반품했어요.",
            "{time} {product} 주문했는데 아직도 안 왔어요 {reaction}",
            "{color} {product:을} 또 샀어요. 벌써 {ordinal}예요.",
            "{product} {color} 색상으로 샀는데 실물이 {adv} 예뻐요.",
            "{apparel} 사이즈는 {size:으로} 샀는데 {adv} 잘 맞아요.",
            "{duration} 만에 {product} {feature:이} 고장 났어요.",
            "{product} {feature:이} 이상해서 고객센터에 문의했더니 {ndays} 만에 교환해 줬어요.",
            "{person:이} 쓰던 {product:이} 좋아 보여서 따라 샀어요.",
            "{feature:과} {feature} 모두 {pred_pos}.",
            "매일 쓰는데 {feature:이} {adv} {pred_pos}.",
            "상세 페이지랑 {feature:이} 달라서 {adv} 아쉬워요.",
        ),
    },
    "chat": {
        "first": (
            "{name:아} {day} {activity} 갈래? {reaction}",
            "{day} {place_local}에서 {clock}에 보자 {reaction}",
            "나 {person:이랑} {place_local} 거의 다 왔어 {reaction}",
            "{day} {food} 먹으러 갈 사람? {reaction}",
            "{greeting} {day} {food:이나} 먹을까? {reaction}",
            "{person:이} 그러는데 {place_local} 근처에 {food} 맛집 생겼대",
            "{name:아} 미안 {delay} {minutes} 정도 늦을 것 같아 {reaction}",
            "{day} 시간 돼? {activity} 가자 {reaction}",
            "ㅇㅋ 그럼 {day} {clock}에 {place_local}에서 만나 {reaction}",
            "{person:이랑} {activity} 가는 거 어때? {reaction}",
            "헐 진짜? {person:이} {event}에 간대? {reaction}",
            "{name:아} {day} {work} {doc} 좀 보내줘!", "드디어 {color} {product} 샀다 {reaction}",
            "나 {time} {item} {place_local}에 두고 온 것 같아 {reaction}",
            "{name:아} 생일 축하해 {reaction} {day} {food} 먹자",
            "{name:아} {work} 다 했어? {day} 내야 돼",
            "{person:이랑} {place_local} 갔다가 방금 집 도착 {chat_state} {reaction}",
        ),
    },
    "qa": {
        "first": (
            "{product} {feature} 어떤가요?", "{product:은} {accessory:이} 같이 오나요?",
            "{color} {apparel} {size} 사이즈 재입고 언제 되나요?", "{product} {city}까지 배송 며칠 걸리나요?",
            "{product} 색상은 {color} 말고 다른 것도 있나요?", "{color} {product} 세척은 어떻게 하나요?",
            "{product} A/S 기간은 얼마나 되나요?", "{product:을} 매일 써도 괜찮을까요?",
        ),
        "rest": (
            "안녕하세요 고객님, {accessory:은} 기본 구성에 포함되어 있습니다.",
            "네, {color} 색상도 준비되어 있습니다.", "주문 후 {ndays} 이내에 출고됩니다.",
            "보증 기간은 구매일로부터 {warranty}입니다.", "문의 주셔서 감사합니다.",
            "자세한 사항은 고객센터로 연락 주세요.", "{size} 사이즈는 {restock}에 재입고될 예정입니다.",
            "저도 궁금했는데 잘 맞더라고요.", "물세척은 피하시고 마른 천으로 닦아 주세요.",
        ),
    },
    "news": {
        "first": (
            "{org:은} {time} {topic} 관련 계획을 {verb_news}.",
            "{city}의 {metric:이} 전년 대비 {percent} {change}.",
            "{org}에 따르면 {topic} 문제는 {year}까지 이어질 전망이다.",
            "{time} {city} 지역에 {weather:이} 이어지면서 시민들의 불편이 커지고 있다.",
            "{org} 안팎에서는 {topic:이} {year} 하반기에 다시 논의될 것으로 보고 있다.",
            '{topic}에 대해 {org} 관계자는 "{quote}"라고 말했다.',
            "이번 {topic} 조치로 {city}에서만 약 {count} 명이 혜택을 받을 것으로 예상된다.",
            "{city}에서 열릴 예정이던 {event:이} {weather} 때문에 연기됐다.",
            "{org:은} {topic}에 대한 의견을 다음 달까지 받기로 했다.",
            "{city}의 {metric:은} 석 달 연속 {change}.",
            "{city} 주민들은 {topic:을} 두고 {org}에 오랫동안 불만을 제기해 왔다.",
            "{org:과} {org:은} {topic:을} 놓고 이견을 좁히지 못했다.",
        ),
    },
}

# fmt: on

KINDS = ("canned", "review_short", "review", "chat", "qa", "news")


@dataclass(frozen=True)
class _Profile:
    korean_per_1000: int
    kind_weights: tuple[int, ...]  # aligned with KINDS
    sentences: dict[str, tuple[int, ...]]  # kind -> weights for 1, 2, 3, ... sentences
    long_per_100k: int  # texts per 100,000 forced to a long length
    long_chars: tuple[int, int, int]  # (smallest target, largest target, hard maximum)
    long_kinds: tuple[str, ...]


PROFILES: dict[str, _Profile] = {
    "demo": _Profile(
        korean_per_1000=400,
        kind_weights=(8, 250, 240, 260, 100, 142),  # per mille, aligned with KINDS
        sentences={
            "canned": (1,),
            "review_short": (88, 12),
            "review": (50, 22, 11, 7, 4, 3, 1, 1, 1),
            "chat": (75, 18, 5, 2),
            "qa": (20, 50, 22, 8),
            "news": (40, 24, 13, 9, 6, 4, 2, 1, 1),
        },
        long_per_100k=500,
        long_chars=(800, 1300, 1400),
        long_kinds=("review", "news"),
    ),
    "short": _Profile(
        korean_per_1000=400,
        kind_weights=(6, 30, 26, 24, 6, 8),
        sentences={
            "canned": (1,),
            "review_short": (92, 8),
            "review": (90, 10),
            "chat": (92, 8),
            "qa": (80, 20),
            "news": (95, 5),
        },
        long_per_100k=0,
        long_chars=(0, 0, 0),
        long_kinds=(),
    ),
    "reviews": _Profile(
        korean_per_1000=480,
        kind_weights=(10, 72, 18, 0, 0, 0),
        sentences={
            "canned": (1,),
            "review_short": (92, 6, 2),
            "review": (55, 20, 11, 7, 4, 2, 1),
            "chat": (1,),
            "qa": (1,),
            "news": (1,),
        },
        long_per_100k=1000,
        long_chars=(500, 1900, 2000),
        long_kinds=("review",),
    ),
}

# --------------------------------------------------------------------------------------------------
# Korean particles
# --------------------------------------------------------------------------------------------------

_JOSA = {
    "이": ("이", "가"),
    "은": ("은", "는"),
    "을": ("을", "를"),
    "과": ("과", "와"),
    "이랑": ("이랑", "랑"),
    "이에요": ("이에요", "예요"),
    "아": ("아", "야"),
    "이나": ("이나", "나"),
}
_DIGIT_BATCHIM = {
    "0": True,
    "1": True,
    "2": False,
    "3": True,
    "4": False,
    "5": False,
    "6": True,
    "7": True,
    "8": True,
    "9": False,
}
_LATIN_BATCHIM = {"L": True, "M": True, "N": True, "R": True}


def _has_batchim(word: str) -> bool:
    last = word[-1]
    if "가" <= last <= "힣":
        return (ord(last) - 0xAC00) % 28 != 0
    if last in _DIGIT_BATCHIM:
        return _DIGIT_BATCHIM[last]
    if last.isascii() and last.isalpha():
        return _LATIN_BATCHIM.get(last.upper(), False)
    raise ValueError(f"cannot attach a Korean particle to {word!r}")


def _rieul(word: str) -> bool:
    last = word[-1]
    if "가" <= last <= "힣":
        return (ord(last) - 0xAC00) % 28 == 8
    return last in "178" or last.upper() == "L"


def attach_particle(word: str, particle: str) -> str:
    if particle == "도":
        return word + "도"
    if particle == "으로":
        return word + ("으로" if _has_batchim(word) and not _rieul(word) else "로")
    with_final, without_final = _JOSA[particle]
    return word + (with_final if _has_batchim(word) else without_final)


# --------------------------------------------------------------------------------------------------
# Compiled bank
# --------------------------------------------------------------------------------------------------

SLOT = re.compile(r"\{(\w+)(?::(\w+))?\}")


@dataclass(frozen=True)
class _Template:
    fmt: str  # str.format pattern with positional fields
    slots: tuple[tuple[str, str], ...]  # (word list, particle)
    capitalize: bool


@dataclass(frozen=True)
class _Group:
    first: tuple[_Template, ...]
    rest: tuple[_Template, ...]


@dataclass(frozen=True)
class _Bank:
    words: dict[tuple[str, str, str], np.ndarray]  # (lang, list, particle) -> object array
    cum: dict[tuple[str, str], np.ndarray]  # (lang, list) -> cumulative integer weights
    groups: dict[tuple[str, str], _Group]  # (lang, kind) -> templates


def _zipf_cum(size: int) -> np.ndarray:
    # Integer weights only: 10000 // (rank + 3) is a mild Zipf curve, identical on every machine.
    return np.cumsum(np.array([10_000 // (rank + 3) for rank in range(size)], dtype=np.int64))


def _compile(text: str, lang: str, vocab: dict[str, tuple[str, ...]]) -> _Template:
    slots: list[tuple[str, str]] = []

    def field(match: re.Match[str]) -> str:
        name, particle = match.group(1), match.group(2) or ""
        if name not in vocab:
            raise KeyError(f"template {text!r} uses unknown word list {name!r}")
        slots.append((name, particle))
        return "{" + str(len(slots) - 1) + "}"

    fmt = SLOT.sub(field, text)
    return _Template(fmt=fmt, slots=tuple(slots), capitalize=lang == "en" and fmt.startswith("{"))


@lru_cache(maxsize=1)
def _bank() -> _Bank:
    words: dict[tuple[str, str, str], np.ndarray] = {}
    cum: dict[tuple[str, str], np.ndarray] = {}
    groups: dict[tuple[str, str], _Group] = {}
    for lang, vocab, templates in (("en", _EN_WORDS, _EN_TEMPLATES), ("ko", _KO_WORDS, _KO_TEMPLATES)):
        for name, values in vocab.items():
            words[(lang, name, "")] = np.array(values, dtype=object)
            cum[(lang, name)] = _zipf_cum(len(values))
        for kind in KINDS:
            spec = templates[kind]
            first = tuple(_compile(t, lang, vocab) for t in spec["first"])
            rest = tuple(_compile(t, lang, vocab) for t in spec.get("rest", spec["first"]))
            groups[(lang, kind)] = _Group(first=first, rest=rest)
            for template in first + rest:
                for name, particle in template.slots:
                    if particle and (lang, name, particle) not in words:
                        attached = [attach_particle(w, particle) for w in vocab[name]]
                        words[(lang, name, particle)] = np.array(attached, dtype=object)
    return _Bank(words=words, cum=cum, groups=groups)


def _draw(rng: np.random.Generator, cum: np.ndarray, size: int) -> np.ndarray:
    """``size`` indices drawn with integer weights given as a cumulative array."""
    return np.searchsorted(cum, rng.integers(0, int(cum[-1]), size=size), side="right")


def _cum(weights: tuple[int, ...]) -> np.ndarray:
    return np.cumsum(np.asarray(weights, dtype=np.int64))


def _sentences(
    rng: np.random.Generator, bank: _Bank, lang: str, templates: tuple[_Template, ...], count: int
) -> list[str]:
    """``count`` sentences from ``templates`` (chosen uniformly), slots filled from the word lists."""
    if count <= 0:
        return []
    choice = rng.integers(0, len(templates), size=count)
    order = np.argsort(choice, kind="stable")
    bounds = np.searchsorted(choice[order], np.arange(len(templates) + 1))
    out = np.empty(count, dtype=object)
    for t_index, template in enumerate(templates):
        rows = order[bounds[t_index] : bounds[t_index + 1]]
        m = rows.size
        if m == 0:
            continue
        if not template.slots:
            out[rows] = template.fmt
            continue
        columns = [
            bank.words[(lang, name, particle)][_draw(rng, bank.cum[(lang, name)], m)]
            for name, particle in template.slots
        ]
        fmt = template.fmt.format
        filled = [fmt(*args) for args in zip(*columns, strict=True)]
        if template.capitalize:
            filled = [s[0].upper() + s[1:] for s in filled]
        out[rows] = filled
    return out.tolist()


def make_texts(n: int, *, seed: int = 0, profile: str = "demo") -> list[str]:
    """``n`` synthetic texts (Korean and English) for ``profile``, identical for the same arguments."""
    if profile not in PROFILES:
        raise ValueError(f"unknown profile {profile!r}; choose one of {sorted(PROFILES)}")
    n = int(n)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if n == 0:
        return []
    cfg = PROFILES[profile]
    bank = _bank()
    rng = np.random.default_rng(seed)

    is_korean = rng.integers(0, 1000, size=n) < cfg.korean_per_1000
    kind = _draw(rng, _cum(cfg.kind_weights), n)
    n_sent = np.ones(n, dtype=np.int64)
    for k_index, name in enumerate(KINDS):
        rows = np.flatnonzero(kind == k_index)
        if rows.size:
            n_sent[rows] = _draw(rng, _cum(cfg.sentences[name]), rows.size) + 1

    target = np.zeros(n, dtype=np.int64)
    if cfg.long_per_100k:
        lo, hi, _ = cfg.long_chars
        is_long = rng.integers(0, 100_000, size=n) < cfg.long_per_100k
        long_rows = np.flatnonzero(is_long)
        target[long_rows] = rng.integers(lo, hi + 1, size=long_rows.size)
        long_kind_index = np.array([KINDS.index(k) for k in cfg.long_kinds], dtype=np.int64)
        kind[long_rows] = long_kind_index[rng.integers(0, long_kind_index.size, size=long_rows.size)]
        # Enough sentences to pass the target even if all were short (~9 characters or more).
        n_sent[long_rows] = target[long_rows] // 9 + 4
    hard_max = cfg.long_chars[2]

    out = np.empty(n, dtype=object)
    for lang, lang_mask in (("en", ~is_korean), ("ko", is_korean)):
        for k_index, name in enumerate(KINDS):
            rows = np.flatnonzero(lang_mask & (kind == k_index))
            if rows.size == 0:
                continue
            group = bank.groups[(lang, name)]
            counts = n_sent[rows]
            firsts = _sentences(rng, bank, lang, group.first, rows.size)
            rests = _sentences(rng, bank, lang, group.rest, int(counts.sum()) - rows.size)
            texts: list[str] = []
            pos = 0
            for first, c, goal in zip(firsts, counts.tolist(), target[rows].tolist(), strict=True):
                if c == 1:
                    texts.append(first)
                elif goal == 0:
                    texts.append(" ".join([first, *rests[pos : pos + c - 1]]))
                else:
                    texts.append(_grow(first, rests[pos : pos + c - 1], goal, hard_max))
                pos += c - 1
            out[rows] = texts
    return out.tolist()


def _grow(first: str, candidates: list[str], goal: int, hard_max: int) -> str:
    """Append sentences until ``goal`` characters are reached, never going past ``hard_max``."""
    parts = [first]
    length = len(first)
    for sentence in candidates:
        if length + 1 + len(sentence) > hard_max:
            continue
        parts.append(sentence)
        length += 1 + len(sentence)
        if length >= goal:
            break
    return " ".join(parts)


# --------------------------------------------------------------------------------------------------
# Demo corpus file with dirty rows
# --------------------------------------------------------------------------------------------------

_DIRTY_COUNTS = {
    "empty": 40,
    "whitespace_only": 40,
    "exact_duplicate": 40,
    "whitespace_variant": 10,
    "nfd_variant": 10,
}
_NON_STRINGS: tuple[object, ...] = (
    42,
    -7,
    0,
    3.14,
    -0.5,
    1e-3,
    None,
    None,
    True,
    False,
    ["not", "a", "text"],
)
_SPACE_PIECES = (" ", "  ", "\t", "\n", "\u3000", "\r\n", " \t ", "\n\n")
_HANGUL = re.compile("[\uac00-\ud7a3]")


def _whitespace(rng: np.random.Generator, k: int) -> list[str]:
    fixed = [" ", "\t", "\n", "\u3000", "   ", "\t\n", " \u3000 ", "\r\n"]
    out = fixed[:k]
    for _ in range(k - len(out)):
        picks = rng.integers(0, len(_SPACE_PIECES), size=int(rng.integers(1, 4)))
        out.append("".join(_SPACE_PIECES[i] for i in picks.tolist()))
    return out


def _pad(rng: np.random.Generator, text: str) -> str:
    pads = ("", " ", "  ", "\t", "\n", "\u3000", " \n")
    left, right = (int(i) for i in rng.integers(0, len(pads), size=2))
    if left == 0 and right == 0:
        right = 1
    return pads[left] + text + pads[right]


def _clean_drops(rows: list[object]) -> dict[str, int]:
    """Drop counts that ``fastlm.corpus.cleaning.clean_texts`` should report (same rules, pure Python)."""
    drops = {"missing": 0, "non_string": 0, "empty": 0, "whitespace_only": 0, "duplicate": 0}
    seen: set[str] = set()
    for value in rows:
        if value is None:
            drops["missing"] += 1
        elif not isinstance(value, str):
            drops["non_string"] += 1
        elif value == "":
            drops["empty"] += 1
        else:
            cleaned = unicodedata.normalize("NFC", value).strip()
            if not cleaned:
                drops["whitespace_only"] += 1
            elif cleaned in seen:
                drops["duplicate"] += 1
            else:
                seen.add(cleaned)
    drops["kept"] = len(seen)
    return drops


def demo_rows(n: int = 24_000, *, seed: int = 0) -> tuple[list[object], dict]:
    """The demo corpus rows (texts and dirty values, in file order) and their counts."""
    n_dirty = sum(_DIRTY_COUNTS.values()) + len(_NON_STRINGS)
    if n < n_dirty + 1_000:
        raise ValueError(f"n must be at least {n_dirty + 1_000}, got {n}")
    texts = make_texts(n - n_dirty, seed=seed, profile="demo")
    rng = np.random.default_rng([seed, 0xD127])

    dirty: list[tuple[str, object]] = []
    dirty += [("empty", "")] * _DIRTY_COUNTS["empty"]
    dirty += [("whitespace_only", s) for s in _whitespace(rng, _DIRTY_COUNTS["whitespace_only"])]
    # Sources for copies: distinct texts, drawn without replacement, in a fixed order.
    sources = rng.permutation(len(texts)).tolist()
    korean = [i for i in sources if _HANGUL.search(texts[i])]
    taken: list[int] = []
    for i in sources:
        if len(taken) == _DIRTY_COUNTS["exact_duplicate"] + _DIRTY_COUNTS["whitespace_variant"]:
            break
        taken.append(i)
    dup_src = taken[: _DIRTY_COUNTS["exact_duplicate"]]
    pad_src = taken[_DIRTY_COUNTS["exact_duplicate"] :]
    nfd_src = [i for i in korean if i not in taken][: _DIRTY_COUNTS["nfd_variant"]]
    dirty += [("exact_duplicate", texts[i]) for i in dup_src]
    dirty += [("whitespace_variant", _pad(rng, texts[i])) for i in pad_src]
    dirty += [("nfd_variant", unicodedata.normalize("NFD", texts[i])) for i in nfd_src]
    dirty += [("non_string", value) for value in _NON_STRINGS]

    positions = np.sort(rng.choice(n, size=len(dirty), replace=False)).tolist()
    order = rng.permutation(len(dirty)).tolist()
    rows: list[object] = []
    text_iter = iter(texts)
    slot = dict(zip(positions, order, strict=True))
    for row in range(n):
        rows.append(dirty[slot[row]][1] if row in slot else next(text_iter))

    by_kind: dict[str, int] = {}
    for kind, _ in dirty:
        by_kind[kind] = by_kind.get(kind, 0) + 1
    counts = {
        "rows": n,
        "texts": len(texts),
        "korean_texts": sum(1 for t in texts if _HANGUL.search(t)),
        "natural_duplicates": len(texts) - len(set(texts)),
        "dirty": by_kind,
        "dirty_total": len(dirty),
        "expected_cleaning": _clean_drops(rows),
    }
    return rows, counts


def write_demo_corpus(path: str | Path, *, n: int = 24_000, seed: int = 0) -> dict:
    """Write the demo corpus as JSONL (``{"text": ...}`` per line) and return its counts.

    The bytes depend only on ``n`` and ``seed``: UTF-8, ``ensure_ascii=False``, sorted keys, ``\\n``
    line endings. ``counts["dirty"]`` gives the dirty rows by kind; ``counts["expected_cleaning"]``
    what cleaning (NFC, strip, drop non-strings/empty/whitespace-only/duplicates) should report.
    """
    rows, counts = demo_rows(n, seed=seed)
    lines = [json.dumps({"text": value}, ensure_ascii=False, sort_keys=True) for value in rows]
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    counts["bytes"] = len(data)
    counts["path"] = str(path)
    return counts
