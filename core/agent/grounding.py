"""Grounding check: money amounts in an answer that no tool returned in the run get flagged.

Amounts are found only with a currency, before or after the number: a symbol (`$`, `€`, `US$`,
`R$`, `S/`…), an upper-case ISO code (`USD`, `COP`…) or a word (`dollars`, `pesos`,
`euros`, `pesos colombianos`…). The currency is normalized to its ISO code when the marker names
one; `$`, `¥`, `dollars` and `pesos` alone are shared by several currencies and give None.

How a number is read (the same rules on both sides, deterministic):
- both `.` and `,` present: the last one is the decimal mark, the other groups thousands
  (`1,250.50`, `1.250,50`);
- one mark repeated: thousands (`1.400.000`, `1,400,000`);
- one mark once, followed by exactly three digits and not after a lone `0`: thousands
  (`1,250` and `1.250` are 1250; `0.250` is 0.25);
- otherwise the mark is decimal (`12,50`, `9.99`, `1,4`);
- thousands groups must be well formed (1-3 leading digits, then groups of 3), so versions and
  dates such as `1.2.3` or `12.05.2024` are not numbers; Indian grouping (`1,00,000`) is read
  too;
- a space (also a no-break or thin one) or an apostrophe between groups of three only ever
  groups thousands (`1 400,50 €`, `CHF 1'400.50`).
A range shares its currency: `$60-600`, `USD 1,000 to 2,000`, `entre 1.000 y 9.999 euros`
and `between $60 and 600` are two amounts each, both shown as the whole range.
A scale may follow: `k`, `m`/`M`/`MM`/`mn`, `bn`/`B`, `thousand`, `mil` (1,000), `million`,
`millón`/`millones`, `mil millones`/`millardo`/`billion` (10^9), `billón`/`billones` (10^12).
Numbers glued to `:`, `/`, `%` or letters (times, dates, percentages, codes) are not amounts;
signs are ignored: amounts and tool numbers are compared as magnitudes.

Tool side: every JSON number in a tool result, and every number inside its strings (no currency
needed; `1,250` there counts as both 1250 and 1.25; a malformed token such as `12.05.2024` counts
for nothing). A JSON key naming a unit (`..._thousands`, `..._millions`, `..._millones`) also
counts its numbers at that scale. A result that is not JSON is read as text.

An amount matches a tool number when they are equal up to rounding, nothing looser (no
percentage tolerance): the difference may be half a unit of the last digit the answer shows,
and at least half a cent (`$1,250.00` matches 1250.004; `$30` matches 29.5..30.5;
`1,4 millones` matches 1,350,000..1,450,000). For scaled amounts the unit is at most a tenth of
the scale (`$1 million` matches 950,000..1,050,000), and the number before the scale also
matches a tool number on its own (`1,4 millones` matches a tool's 1.4 given in millions).
"""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import dataclass, replace
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["Amount", "GroundingReport", "check", "extract_amounts", "tool_numbers", "warning_text"]

_SYMBOLS: dict[str, str | None] = {
    "$": None, "¥": None, "C$": None, "US$": "USD", "U$S": "USD", "CA$": "CAD", "AU$": "AUD",
    "A$": "AUD", "NZ$": "NZD", "MX$": "MXN", "COL$": "COP", "HK$": "HKD", "R$": "BRL",
    "S/": "PEN", "S/.": "PEN", "€": "EUR", "£": "GBP", "₹": "INR", "₩": "KRW", "₽": "RUB",
    "₺": "TRY", "₪": "ILS", "₱": "PHP", "฿": "THB", "₡": "CRC", "₲": "PYG", "₴": "UAH",
    "₦": "NGN",
}  # fmt: skip
# Common ISO 4217 codes; codes that are also English words (ALL, TOP, CUP) are left out.
_CODES = frozenset(
    "USD EUR GBP JPY CNY CHF CAD AUD NZD HKD SGD SEK NOK DKK PLN CZK HUF RUB TRY INR KRW BRL MXN"
    " ARS CLP COP PEN UYU PYG BOB VES CRC GTQ HNL NIO PAB DOP ZAR ILS AED SAR EGP NGN KES PHP"
    " THB IDR MYR VND UAH".split()
)
_WORDS: dict[str, str | None] = {
    "dollar": None, "dollars": None, "us dollars": "USD", "us dollar": "USD",
    "canadian dollars": "CAD", "australian dollars": "AUD",
    "dólar": None, "dólares": None, "dolar": None, "dolares": None,
    "dólares estadounidenses": "USD", "dolares estadounidenses": "USD",
    "dólares americanos": "USD", "dolares americanos": "USD",
    "dólares canadienses": "CAD", "dolares canadienses": "CAD",
    "euro": "EUR", "euros": "EUR", "peso": None, "pesos": None,
    "pesos colombianos": "COP", "pesos mexicanos": "MXN", "pesos argentinos": "ARS",
    "pesos chilenos": "CLP", "pesos uruguayos": "UYU", "pesos dominicanos": "DOP",
    "sol": "PEN", "soles": "PEN", "reales": "BRL", "reais": "BRL",
    "libras esterlinas": "GBP", "pounds sterling": "GBP", "yen": "JPY", "yenes": "JPY",
    "yuan": "CNY", "yuanes": "CNY", "rupees": "INR", "rupias": "INR", "quetzales": "GTQ",
    "colones": "CRC", "lempiras": "HNL", "bolívares": "VES", "bolivares": "VES",
    "guaraníes": "PYG", "guaranies": "PYG",
}  # fmt: skip
_SCALES: dict[str, int] = {
    "k": 10**3, "thousand": 10**3, "thousands": 10**3, "mil": 10**3,
    "m": 10**6, "mm": 10**6, "mn": 10**6, "million": 10**6, "millions": 10**6,
    "millón": 10**6, "millon": 10**6, "millones": 10**6,
    "b": 10**9, "bn": 10**9, "billion": 10**9, "billions": 10**9, "mil millones": 10**9,
    "millardo": 10**9, "millardos": 10**9,
    "billón": 10**12, "billon": 10**12, "billones": 10**12,
}  # fmt: skip
_KEY_SCALE = (("thousand", 10**3), ("million", 10**6), ("millon", 10**6), ("billion", 10**9))

_SP = r"[ \t\u00a0\u202f]"
_NOT_LETTER = r"(?![^\W\d_])"


def _alternation(words: list[str]) -> str:
    """Longest first, so `pesos colombianos` wins over `pesos`; inner spaces match any spacing."""
    ordered = sorted(words, key=len, reverse=True)
    return "|".join(rf"{_SP}+".join(map(re.escape, w.split())) for w in ordered)


_SYMBOL = (
    r"(?<![A-Za-z0-9])(?:"
    + _alternation([s for s in _SYMBOLS if len(s) > 1])
    + r")|["
    + "".join(re.escape(s) for s in _SYMBOLS if len(s) == 1)
    + "]"
)
_CODE = r"(?:" + "|".join(sorted(_CODES)) + r")(?![A-Za-z])"
_WORD = r"(?i:" + _alternation(list(_WORDS)) + r")" + _NOT_LETTER
_PREFIX = rf"{_SYMBOL}|(?<![A-Za-z0-9]){_CODE}"
_SUFFIX = rf"{_SYMBOL}|{_CODE}|(?i:de{_SP}+)?{_WORD}"
_SCALE = (
    rf"(?:{_SP}?(?:k|K|mm|MM|mn|m|M|bn|B)|{_SP}+(?i:"
    + _alternation([w for w in _SCALES if len(w) > 2])
    + rf")){_NOT_LETTER}"
)
_GROUP = r"[ \u00a0\u202f\u2009'\u2019]"  # between groups of three only
_GROUPED = rf"\d{{1,3}}(?:{_GROUP}\d{{3}})+(?:[.,]\d+)?"
_NUMBER = rf"(?:{_GROUPED}|\d+(?:[.,]\d+)*)(?![.,:/]?\d)(?!{_SP}?%)"
_SIGN = r"[-\u2212+]"
_DASH = r"[-\u2010-\u2015\u2212]"
_FREE_NUMBER = rf"(?<![\w.,:/]){_NUMBER}"
_JOIN = (
    rf"(?P<join>{_SP}*{_DASH}{_SP}*|{_SP}+(?P<word>(?i:to|a|hasta|bis|à|au|and|y|et|und)){_SP}+)"
)
_BETWEEN = r"(?i:between|entre|zwischen|from|de|desde|von)"
# joiners that make a range only after a word that opens one: "between 5 and 8", "de 5 a 8"
_OPENED = {"and": "between", "y": "entre", "et": "entre", "und": "zwischen", "a": "de desde"}
# what a count is of, not money: "$120 - 3 nights", "$25 for a 2-hour ride"
_UNITS = (
    r"(?i:nights?|days?|hours?|hrs?|minutes?|mins?|weeks?|months?|years?|people|persons?|guests?"
    r"|pax|times|seats?|rooms?|noches?|d[ií]as?|horas?|minutos?|semanas?|meses|años?|personas?"
    r"|nuits?|jours?|heures?|personnes?|noites?|pessoas?|n[aä]chte|tage|stunden|minuten"
    r"|personen)"
)
_NEXT = re.compile(
    rf"{_JOIN}(?P<n>{_NUMBER})(?P<s>{_SCALE})?{_NOT_LETTER}"
    rf"(?!{_SP}*{_UNITS}{_NOT_LETTER})(?!-[^\W\d_])"
)
_BEFORE = re.compile(
    rf"(?:(?P<opener>{_BETWEEN}){_SP}+)?(?<!\d{_DASH})(?P<n>{_FREE_NUMBER})(?P<s>{_SCALE})?"
    rf"{_JOIN}$"
)
_OPENER_BEFORE = re.compile(rf"(?P<opener>{_BETWEEN}){_SP}+\Z")
_WORD_BEFORE = re.compile(r"[^\W\d_]+[ \t\u00a0]*\Z")  # "Gate 4 - 35 USD": no range
_YEAR = re.compile(r"(?:19|20)\d\d")  # "Summer 2025 – 120 EUR", "€60 — 2025 season"
_RANGE_REACH = 80  # how far before a suffixed amount its range's start may be

_AMOUNT = re.compile(
    rf"(?P<pre>{_PREFIX}){_SP}{{0,2}}{_SIGN}?(?P<n1>{_NUMBER})(?P<s1>{_SCALE})?"
    rf"(?:{_SP}{{0,2}}(?P<p1>{_SUFFIX})(?!{_SP}{{0,2}}{_SIGN}?\d))?"  # "USD 30 EUR 40": two
    rf"|(?P<n2>{_FREE_NUMBER})(?P<s2>{_SCALE})?{_SP}{{0,2}}(?P<p2>{_SUFFIX})"
    rf"(?!{_SP}{{0,2}}{_SIGN}?\d)"  # "12 EUR 40": EUR is 40's
)
_TOOL_NUMBER = re.compile(rf"\d+(?:[.,]\d+)*(?P<s>{_SCALE})?")
_TOOL_GROUPED = re.compile(rf"{_GROUPED}(?![.,]?\d)(?P<s>{_SCALE})?")

_HALF_CENT = Decimal("0.005")


@dataclass(frozen=True, slots=True)
class Amount:
    """A money amount found in text; `quantum` is the value of its last shown digit."""

    value: Decimal
    currency: str | None  # ISO code when the marker names one
    text: str
    span: tuple[int, int]
    quantum: Decimal
    scale: int = 1  # 10**6 for "1,4 millones": value = mantissa * scale

    def as_dict(self) -> dict[str, str | None]:
        """JSON-able form for the run record."""
        return {"text": self.text, "value": str(self.value), "currency": self.currency}


@dataclass(frozen=True, slots=True)
class GroundingReport:
    """The amounts of an answer, those no tool number grounds, and the answer's language."""

    amounts: tuple[Amount, ...]
    unmatched: tuple[Amount, ...]
    language: str  # "en", "es", "fr", "pt" or "de", guessed from the answer for the warning

    @property
    def ok(self) -> bool:
        return not self.unmatched


def _groups_ok(groups: list[str]) -> bool:
    head = groups[0]
    return (
        1 <= len(head) <= 3
        and not (head.startswith("0") and len(groups) > 1)
        and all(len(g) == 3 for g in groups[1:])
    )


def _indian(groups: list[str]) -> bool:
    """`1,00,000` and `12,34,56,789`: groups of two before the last three."""
    *head, last = groups
    return (
        len(groups) > 2
        and 1 <= len(head[0]) <= 2
        and not head[0].startswith("0")
        and all(len(g) == 2 for g in head[1:])
        and len(last) == 3
    )


def _readings(token: str) -> list[tuple[Decimal, int]]:
    """(value, decimals shown) for a digit token; the first is the reading used for answers,
    a second one exists only for the ambiguous `1,250` shape; none when malformed."""
    if re.search(_GROUP, token):  # _GROUPED: the only other mark is the decimal one
        whole, _, frac = re.sub(_GROUP, "", token).replace(",", ".").partition(".")
        return [(Decimal(f"{whole}.{frac or 0}"), len(frac))]
    marks = [c for c in token if c in ".,"]
    if not marks:
        return [(Decimal(token), 0)]
    if len(set(marks)) == 2:
        dec = marks[-1]
        if marks.count(dec) > 1:
            return []
        whole, frac = token.rsplit(dec, 1)
        groups = whole.split("," if dec == "." else ".")
        return [(Decimal(f"{''.join(groups)}.{frac}"), len(frac))] if _groups_ok(groups) else []
    groups = token.split(marks[0])
    if len(groups) > 2:
        well_formed = _groups_ok(groups) or (marks[0] == "," and _indian(groups))
        return [(Decimal("".join(groups)), 0)] if well_formed else []
    head, tail = groups
    decimal = (Decimal(f"{head}.{tail}"), len(tail))
    if len(tail) == 3 and _groups_ok(groups):
        return [(Decimal(head + tail), 0), decimal]
    return [decimal]


def _scale_of(text: str | None) -> int:
    if not text:
        return 1
    return _SCALES[" ".join(text.split()).lower()]


def _currency(marker: str | None) -> str | None:
    if marker is None:
        return None
    key = " ".join(marker.split())
    if key in _CODES:
        return key
    if key in _SYMBOLS:
        return _SYMBOLS[key]
    return _WORDS[key.lower().removeprefix("de ")]


def _amount(
    number: str, scale_text: str | None, currency: str | None, m: re.Match[str]
) -> Amount | None:
    readings = _readings(number)
    if not readings:
        return None
    mantissa, decimals = readings[0]
    return _scaled(
        Amount(mantissa, currency, m[0], m.span(), Decimal(1).scaleb(-decimals)),
        _scale_of(scale_text),
    )


def _scaled(amount: Amount, scale: int) -> Amount:
    if scale == 1:
        return amount
    quantum = min(amount.quantum * scale, Decimal(scale) / 10)
    value = Decimal(format((amount.value * scale).normalize(), "f"))  # 1400000, not 1400000.0
    return replace(amount, value=value, quantum=quantum, scale=scale)


def _opened(word: str | None, opener: str | None) -> bool:
    """Whether a joiner makes a range: a dash, "to"... always; "and", "a"... only after the
    word that opens such a range."""
    needs = _OPENED.get((word or "").lower())
    return needs is None or (opener is not None and opener.lower() in needs.split())


def _a_range(first: Amount, last: Amount, numbers: tuple[str, str]) -> bool:
    """Two amounts read as a range: ascending, and neither a year."""
    return first.value < last.value and not any(_YEAR.fullmatch(n) for n in numbers)


def _range_end(text: str, m: re.Match[str], first: Amount) -> Amount | None:
    """The other end of a range `m` starts (`$60-600`, `between USD 60 and 600`)."""
    nxt = _NEXT.match(text, m.end())
    if nxt is None:
        return None
    opener = _OPENER_BEFORE.search(text, 0, m.start())
    if not _opened(nxt["word"], opener["opener"] if opener else None):
        return None
    last = _amount(nxt["n"], nxt["s"], first.currency, nxt)
    if last is None or not _a_range(first, last, (m["n1"] or "", nxt["n"])):
        return None
    return last


def _range_start(text: str, m: re.Match[str], last: Amount) -> tuple[Amount, int] | None:
    """The start of a range `m` ends (`5-8 USD`, `entre 1.000 y 9.999 euros`), and where the
    range's text starts."""
    before = _BEFORE.search(text, max(0, m.start() - _RANGE_REACH), m.start())
    if before is None or not _opened(before["word"], before["opener"]):
        return None
    if before["opener"] is None and _WORD_BEFORE.search(text, 0, before.start("n")):
        return None  # "Gate 4 - 35 USD", "table for 6 - 180 USD": a count, then the price
    first = _amount(before["n"], before["s"], last.currency, before)
    if first is None or not _a_range(_scaled(first, last.scale), last, (before["n"], m["n2"])):
        return None
    return first, before.start("n")


def extract_amounts(text: str) -> list[Amount]:
    """Every money amount written with a currency in `text`, in order."""
    found: list[Amount] = []
    for m in _AMOUNT.finditer(text):
        if found and m.start() < found[-1].span[1]:  # the end of a range: counted
            continue
        pre = m["pre"]
        number, scale_text, post = (
            (m["n1"], m["s1"], m["p1"]) if pre else (m["n2"], m["s2"], m["p2"])
        )
        amount = _amount(number, scale_text, _currency(pre) or _currency(post), m)
        if amount is None:
            continue
        if pre and not post and (end := _range_end(text, m, amount)) is not None:
            span = (m.start(), end.span[1])
        elif not pre and (start := _range_start(text, m, amount)) is not None:
            end, span = start[0], (start[1], m.end())
        else:
            found.append(amount)
            continue
        if found and found[-1].span[1] > span[0]:  # the range begins with an amount found
            span = (found.pop().span[0], span[1])
        first, last = (amount, end) if pre else (end, amount)
        if first.scale == 1:  # "5 to 8 million": both in millions
            first = _scaled(first, last.scale)
        found += [replace(a, text=text[span[0] : span[1]], span=span) for a in (first, last)]
    return found


def _text_numbers(text: str) -> Iterator[Decimal]:
    for m in (*_TOOL_NUMBER.finditer(text), *_TOOL_GROUPED.finditer(text)):
        token = m[0][: m.start("s") - m.start()] if m["s"] else m[0]
        scale = _scale_of(m["s"])
        for value, _ in _readings(token):
            yield value
            if scale > 1:
                yield value * scale


def _key_scale(key: str) -> int:
    lowered = key.lower()
    return next((scale for word, scale in _KEY_SCALE if word in lowered), 1)


def _walk(data: Any) -> Iterator[Decimal]:
    """Numbers in parsed JSON, iteratively so a deeply nested result cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(data, 1)]
    while stack:
        node, scale = stack.pop()
        if isinstance(node, dict):
            stack.extend((v, max(scale, _key_scale(str(k)))) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((item, scale) for item in node)
        elif isinstance(node, str | Decimal):
            found = _text_numbers(node) if isinstance(node, str) else [node]
            for value in found:
                if value.is_finite():
                    yield abs(value)
                    if scale > 1:
                        yield abs(value) * scale


def tool_numbers(tool_results: list[str]) -> list[Decimal]:
    """All numbers the tool results of a run contained, sorted, as magnitudes."""
    numbers: set[Decimal] = set()
    for content in tool_results:
        try:
            data = json.loads(
                content, parse_float=Decimal, parse_int=Decimal, parse_constant=lambda _: None
            )
        except (ValueError, InvalidOperation, RecursionError):
            data = content
        numbers.update(_walk(data))
    return sorted(numbers)


def _near(numbers: list[Decimal], target: Decimal, tolerance: Decimal) -> bool:
    i = bisect_left(numbers, target - tolerance)
    return i < len(numbers) and numbers[i] <= target + tolerance


def _grounded(amount: Amount, numbers: list[Decimal]) -> bool:
    if _near(numbers, amount.value, max(amount.quantum / 2, _HALF_CENT)):
        return True
    if amount.scale == 1:
        return False
    mantissa_tolerance = max(amount.quantum / amount.scale / 2, _HALF_CENT)
    return _near(numbers, amount.value / amount.scale, mantissa_tolerance)


# words and letters that tell the answer's language, for the warning (a guess; English wins
# ties); Spanish first among the rest, as most answers that are not English here are
_HINTS: dict[str, tuple[frozenset[str], str]] = {
    "en": (
        frozenset(
            "the an of to is are your you for with this that it and price costs hello thanks"
            " can have".split()
        ),
        "",
    ),
    "es": (
        frozenset(
            "el la los las de del que por para con una un es está son su tu usted y pesos"
            " millones mil precio cuesta hola gracias puedes tienes".split()
        ),
        "¿¡ñáéíóú",
    ),
    "fr": (
        frozenset(
            "le la les des du que pour avec une est sont votre vous et prix coûte bonjour"
            " merci ce cette nous".split()
        ),
        "àâçèéêëîïôûùœ",
    ),
    "pt": (
        frozenset(
            "o os as do da que por para com uma um é são seu sua você e preço custa olá"
            " obrigado não".split()
        ),
        "ãõçáéíóúâê",
    ),
    "de": (
        frozenset(
            "der die das und ist sind ihr sie für mit ein eine preis kostet hallo danke nicht"
            " wir".split()
        ),
        "äöüß",
    ),
}


def _language(text: str) -> str:
    lowered = text.lower()
    words = re.findall(r"[^\W\d_]+", lowered)
    scores = {
        lang: sum(w in hints for w in words) + sum(lowered.count(c) for c in letters)
        for lang, (hints, letters) in _HINTS.items()
    }
    best = max(scores, key=lambda lang: scores[lang])  # the first of a tie: English
    return best if scores[best] > scores["en"] else "en"


def check(answer: str, tool_results: list[str]) -> GroundingReport:
    """Which money amounts in `answer` no tool result of the run contained."""
    amounts = tuple(extract_amounts(answer))
    numbers = tool_numbers(tool_results) if amounts else []
    unmatched = tuple(a for a in amounts if not _grounded(a, numbers))
    return GroundingReport(amounts, unmatched, _language(answer))


_MAX_LISTED = 5
_MESSAGES = {
    "en": (
        "Please confirm this amount before relying on it: {}.",
        "Please confirm these amounts before relying on them: {}.",
        " and ",
        "{} more",
    ),
    "es": (
        "Por favor, confirma este monto antes de usarlo: {}.",
        "Por favor, confirma estos montos antes de usarlos: {}.",
        " y ",
        "{} más",
    ),
    "fr": (
        "Merci de confirmer ce montant avant de vous y fier : {}.",
        "Merci de confirmer ces montants avant de vous y fier : {}.",
        " et ",
        "{} de plus",
    ),
    "pt": (
        "Por favor, confirme este valor antes de confiar nele: {}.",
        "Por favor, confirme estes valores antes de confiar neles: {}.",
        " e ",
        "mais {}",
    ),
    "de": (
        "Bitte bestätigen Sie diesen Betrag, bevor Sie sich darauf verlassen: {}.",
        "Bitte bestätigen Sie diese Beträge, bevor Sie sich darauf verlassen: {}.",
        " und ",
        "{} weitere",
    ),
}


def warning_text(report: GroundingReport, language_hint: str | None = None) -> str:
    """A short warning listing the unmatched amounts ("" when there are none); `language_hint`
    is a tag such as "es" or "es-CO", else the answer's own language is used."""
    texts = list(dict.fromkeys(a.text for a in report.unmatched))
    if not texts:
        return ""
    lang = (language_hint or report.language).split("-")[0].lower()
    one, many, conj, more = _MESSAGES.get(lang, _MESSAGES["en"])
    shown = texts[:_MAX_LISTED]
    if len(texts) > _MAX_LISTED:
        shown.append(more.format(len(texts) - _MAX_LISTED))
    listed = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + conj + shown[-1]
    return (one if len(texts) == 1 else many).format(listed)
