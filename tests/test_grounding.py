"""Grounding check: money amounts in EN/ES formats, tool numbers, matching and the warning."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.agent.grounding import (
    GroundingReport,
    check,
    extract_amounts,
    tool_numbers,
    warning_text,
)

# -- extraction ---------------------------------------------------------------------------

AMOUNTS = [
    # the examples
    ("El total es 1.400.000 COP.", "1400000", "COP", "1.400.000 COP"),
    ("Son 1,4 millones de pesos.", "1400000", None, "1,4 millones de pesos"),
    ("Your balance is $1,250.00.", "1250.00", None, "$1,250.00"),
    ("It costs USD 30 per month.", "30", "USD", "USD 30"),
    # English separators
    ("$1,250", "1250", None, "$1,250"),
    ("£9.99 a month", "9.99", "GBP", "£9.99"),
    ("about $1,234,567.89 in total", "1234567.89", None, "$1,234,567.89"),
    ("30 USD", "30", "USD", "30 USD"),
    ("US$ 20", "20", "USD", "US$ 20"),
    ("US$20", "20", "USD", "US$20"),
    ("2.5 million dollars", "2500000", None, "2.5 million dollars"),
    ("$5k", "5000", None, "$5k"),
    ("€30m budget", "30000000", "EUR", "€30m"),
    ("$2.5B deal", "2500000000", None, "$2.5B"),
    ("a 30USD fee", "30", "USD", "30USD"),
    ("$1,250.00 USD", "1250.00", "USD", "$1,250.00 USD"),
    ("MXN 250", "250", "MXN", "MXN 250"),
    ("20 US dollars", "20", "USD", "20 US dollars"),
    ("$0.250 per unit", "0.250", None, "$0.250"),
    ("-$30 refund", "30", None, "$30"),
    # Spanish / European separators
    ("€12,50", "12.50", "EUR", "€12,50"),
    ("12,50 €", "12.50", "EUR", "12,50 €"),
    ("EUR 1.234,56", "1234.56", "EUR", "EUR 1.234,56"),
    ("Cuesta $1.400.000.", "1400000", None, "$1.400.000"),
    ("$ 1.400.000", "1400000", None, "$ 1.400.000"),
    ("COP 1,4 millones", "1400000", "COP", "COP 1,4 millones"),
    ("3 mil pesos", "3000", None, "3 mil pesos"),
    ("R$ 15,00", "15.00", "BRL", "R$ 15,00"),
    ("S/ 20", "20", "PEN", "S/ 20"),
    ("S/.20", "20", "PEN", "S/.20"),
    ("30 pesos colombianos", "30", "COP", "30 pesos colombianos"),
    ("1 millón de dólares", "1000000", None, "1 millón de dólares"),
    ("1,5 mil millones de pesos", "1500000000", None, "1,5 mil millones de pesos"),
    ("2,5 millones de dólares estadounidenses", "2500000", "USD", None),
    ("5 euros", "5", "EUR", "5 euros"),
    ("unos 1.250 dólares", "1250", None, "1.250 dólares"),
    ("2 billones de pesos", "2000000000000", None, "2 billones de pesos"),
]


@pytest.mark.parametrize(("text", "value", "currency", "matched"), AMOUNTS)
def test_extracts_one_amount(
    text: str, value: str, currency: str | None, matched: str | None
) -> None:
    [amount] = extract_amounts(text)
    assert amount.value == Decimal(value)
    assert amount.currency == currency
    assert text[amount.span[0] : amount.span[1]] == amount.text
    if matched is not None:
        assert amount.text == matched


@pytest.mark.parametrize(
    ("token", "value"),
    [
        ("1,250", "1250"),  # one mark + three digits: thousands, in either language
        ("1.250", "1250"),
        ("12,50", "12.5"),  # one mark + two digits: decimal
        ("1,4", "1.4"),
        ("1.2345", "1.2345"),
        ("0,250", "0.25"),  # a lone 0 cannot lead a thousands group
        ("1.400.000", "1400000"),
        ("1,400,000", "1400000"),
        ("1.250,50", "1250.50"),
        ("1,250.50", "1250.50"),
        ("12345,678", "12345.678"),  # a five-digit head is not a thousands group
    ],
)
def test_number_rules(token: str, value: str) -> None:
    assert [a.value for a in extract_amounts(f"USD {token}")] == [Decimal(value)]
    assert [a.value for a in extract_amounts(f"{token} €")] == [Decimal(value)]


def test_several_amounts_in_order() -> None:
    text = "USD 30 EUR 40, then $10-$20, 5-8 USD and 1.400.000 COP"
    assert [a.text for a in extract_amounts(text)] == [
        "USD 30",
        "EUR 40",
        "$10",
        "$20",
        "5-8 USD",  # a range: both ends, each shown as the whole range
        "5-8 USD",
        "1.400.000 COP",
    ]


@pytest.mark.parametrize(
    ("text", "values", "shown"),
    [
        ("$60-600", ["60", "600"], "$60-600"),
        ("$1,000–2,000", ["1000", "2000"], "$1,000–2,000"),
        ("USD 1,000 – 9,999 a month", ["1000", "9999"], "USD 1,000 – 9,999"),
        ("from $60 to 600, depending", ["60", "600"], "$60 to 600"),
        ("Between USD 60 and 600.", ["60", "600"], "USD 60 and 600"),
        ("entre 1.000 y 9.999 euros", ["1000", "9999"], "1.000 y 9.999 euros"),
        ("de 5 a 8 millones de pesos", ["5000000", "8000000"], "5 a 8 millones de pesos"),
        ("5 - 8 USD", ["5", "8"], "5 - 8 USD"),
        ("1 000-2 000 €", ["1000", "2000"], "1 000-2 000 €"),
        ("$5-8 million", ["5000000", "8000000"], "$5-8 million"),
    ],
)
def test_a_range_is_two_amounts_shown_whole(text: str, values: list[str], shown: str) -> None:
    amounts = extract_amounts(text)
    assert [a.value for a in amounts] == [Decimal(v) for v in values]
    assert {a.text for a in amounts} == {shown}
    assert len({a.currency for a in amounts}) == 1


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("$30 and 2 extra hours", ["30"]),  # "and" makes a range only after "between"
        ("USD 30 y 2 horas", ["30"]),
        ("$60 to 3pm", ["60"]),
        ("on 2024-05-12 EUR 40", ["40"]),
        ("12 EUR 40", ["40"]),
        ("$10-$20", ["10", "20"]),
        ("$60 to 600 dollars", ["60", "600"]),  # two amounts already; no double count
    ],
)
def test_no_range_where_there_is_none(text: str, values: list[str]) -> None:
    assert [a.value for a in extract_amounts(text)] == [Decimal(v) for v in values]


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("The double room is $120 - 3 nights minimum.", ["120"]),
        ("It's $25 a 2-hour session.", ["25"]),
        ("Summer 2025 – 120 EUR per person.", ["120"]),
        ("Annual membership: €60 — 2025 season.", ["60"]),
        ("Tickets are $15 - 7 days a week.", ["15"]),
        ("Gate 4 - 35 USD per bag.", ["35"]),
        ("Table for 6 - 180 USD total.", ["180"]),
        ("Price $80 – 10 minutes from the beach.", ["80"]),
        ("$30 to 2 people", ["30"]),
    ],
)
def test_counts_years_and_labels_beside_an_amount_are_no_range(
    text: str, values: list[str]
) -> None:
    """Each was read as a range, and the person was asked to confirm an amount never said."""
    assert [a.value for a in extract_amounts(text)] == [Decimal(v) for v in values]


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("1 400 €", "1400"),
        ("1\u00a0400,50\u00a0€", "1400.50"),
        ("1\u202f400 000 €", "1400000"),
        ("CHF 1'400.50", "1400.50"),
        ("CHF 1’400", "1400"),
        ("₹1,00,000", "100000"),
        ("₹2,50,000", "250000"),
        ("₹12,34,56,789", "123456789"),
        ("€ 1 400", "1400"),
    ],
)
def test_grouped_thousands_of_other_countries(text: str, value: str) -> None:
    [amount] = extract_amounts(text)
    assert amount.value == Decimal(value)
    assert amount.text == text


def test_a_range_is_flagged_when_either_end_is_unknown() -> None:
    assert check("From $60 to 600.", ['{"min": 60, "max": 600}']).ok
    report = check("From $60 to 600.", ['{"min": 60}'])
    assert [a.value for a in report.unmatched] == [Decimal(600)]
    assert warning_text(report) == "Please confirm this amount before relying on it: $60 to 600."


def test_a_tool_number_grouped_by_spaces_grounds_it() -> None:
    assert check("Le prix est de 1 400 €.", ['{"prix": "1 400 EUR"}']).ok
    assert not check("Le prix est de 1 400 €.", ['{"prix": 400}']).ok
    assert check("It is 400 €, for 3 people.", ['{"note": "3 400"}']).ok  # each part too


@pytest.mark.parametrize(
    "text",
    [
        "Come on 12/05/2024 or 2024-05-12.",
        "We open at 8:00 and close at 17:30.",
        "Call +57 300 123 4567 or 555-1234.",
        "A 15% discount, or 15 % off.",
        "Requires version 1.2.3, Python 3.11.",
        "1,250 people and 1.400.000 visitors.",
        "1,4 millones de visitas",
        "It is 30 degrees, room 5 k.",
        "12.05.2024 EUR",
        "v1.2 USD",
        "15 % USD",
        "a USD 15% surcharge, $5 % rate",
        "ALL 30 of them, TOP 10",
        "part XEUR 40, ref AUSD 30",
        "I have 3 mil",
        "at 10:30 USD",
        "a 5 kg box",
        "1.2.3 dollars",
    ],
)
def test_no_false_positives(text: str) -> None:
    assert extract_amounts(text) == []


# -- tool numbers -------------------------------------------------------------------------


def test_tool_numbers_walks_json_and_strings() -> None:
    result = json.dumps(
        {
            "balance": 1250.004,
            "items": [{"price": "$1.400.000"}, {"note": "cuesta 1,4 millones"}],
            "flags": [True, False, None],
            "id": "INV-2024-007",
        }
    )
    numbers = tool_numbers([result])
    for expected in ("1250.004", "1400000", "1.4", "2024", "7"):
        assert Decimal(expected) in numbers
    assert Decimal(1) not in numbers  # JSON true is not the number 1
    assert numbers == sorted(numbers)


def test_tool_numbers_ambiguous_string_counts_both_readings() -> None:
    numbers = tool_numbers(['{"text": "1,250"}'])
    assert Decimal("1250") in numbers
    assert Decimal("1.25") in numbers


def test_tool_numbers_key_names_a_scale() -> None:
    numbers = tool_numbers(
        ['{"revenue_millions": 2.5, "costo_en_millones": {"q1": 3, "q2": "4,5"}, "n": 6}']
    )
    assert Decimal(2500000) in numbers
    assert Decimal(3000000) in numbers
    assert Decimal(4500000) in numbers
    assert Decimal(6000000) not in numbers
    assert Decimal("2.5") in numbers


def test_tool_numbers_deeply_nested_result() -> None:
    deep = "[" * 5000 + "1250" + "]" * 5000  # beyond json's recursion limit: read as text
    assert Decimal(1250) in tool_numbers([deep])
    nested = '{"a": ' * 900 + '{"b_millions": 1.25}' + "}" * 900  # parses; walked iteratively
    assert Decimal(1250000) in tool_numbers([nested])


def test_tool_numbers_non_json_and_odd_values() -> None:
    numbers = tool_numbers(["Total: 12,50 EUR on 12.05.2024 (preview cut", '{"x": NaN, "y": -30}'])
    assert Decimal("12.50") in numbers
    assert Decimal(2024) not in numbers  # a date is not a number
    assert Decimal(30) in numbers  # signs are ignored
    assert all(n.is_finite() for n in numbers)


# -- check --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "tool_result"),
    [
        ("Your balance is $1,250.00.", '{"balance": 1250}'),
        ("Your balance is $1,250.00.", '{"balance": 1250.004}'),  # rounding to cents
        ("Your balance is $1,250.00.", '{"balance": "1.250,00 USD"}'),
        ("El saldo es $1.400.000.", '{"saldo": 1400000}'),
        ("Son 1,4 millones de pesos.", '{"saldo": 1400000}'),
        ("Son 1,4 millones de pesos.", '{"saldo": 1387000}'),  # rounded to the shown digit
        ("Son 1,4 millones de pesos.", '{"saldo_millones": 1.4}'),
        ("Son 1,4 millones de pesos.", '{"saldo": 1.4, "unidad": "millones"}'),
        ("It costs USD 30.", '{"price": "30"}'),
        ("It costs about $30.", '{"price": 29.95}'),
        ("It is $1 million.", '{"value": 1040000}'),
        ("Refund of -$30.", '{"amount": -30}'),
        ("Pay 12,50 €", "Total 12.5"),
    ],
)
def test_check_matches(answer: str, tool_result: str) -> None:
    report = check(answer, [tool_result])
    assert report.amounts
    assert report.ok
    assert report.unmatched == ()


@pytest.mark.parametrize(
    ("answer", "tool_result"),
    [
        ("Your balance is $1,250.00.", '{"balance": 1250.01}'),
        ("Your balance is $1,250.00.", '{"balance": 1125}'),  # 10% off is not a match
        ("El saldo es $1.400.000.", '{"saldo": 1400001}'),
        ("Son 1,4 millones de pesos.", '{"saldo": 1460000}'),
        ("It is $1 million.", '{"value": 900000}'),
        ("It costs USD 30.", '{"price": 30.6}'),
        ("Total $45.", '{"a": 30, "b": 15}'),  # sums are not grounded
        ("It costs $30,000.", '{"price": 30}'),  # no unit named, so no scaling guessed
    ],
)
def test_check_flags(answer: str, tool_result: str) -> None:
    report = check(answer, [tool_result])
    assert len(report.unmatched) == 1
    assert not report.ok


def test_check_without_tools_flags_every_amount() -> None:
    report = check("It's $30 or €25, maybe 1.400.000 COP.", [])
    assert [a.text for a in report.unmatched] == ["$30", "€25", "1.400.000 COP"]


def test_check_mixed_and_record() -> None:
    tools = ['{"balance": 1250, "fee": "USD 30"}', '{"error": "timeout"}']
    report = check("Balance $1,250.00, fee USD 30, tax $99.", tools)
    assert [a.text for a in report.amounts] == ["$1,250.00", "USD 30", "$99"]
    [missing] = report.unmatched
    assert missing.as_dict() == {"text": "$99", "value": "99", "currency": None}
    assert json.dumps([a.as_dict() for a in report.unmatched])


def test_check_without_amounts() -> None:
    report = check("We open at 8:00 on 12/05/2024, 15% off.", ["{}"])
    assert report.amounts == ()
    assert report.ok
    assert warning_text(report) == ""


# -- warning ------------------------------------------------------------------------------


def test_warning_english_single_and_many() -> None:
    one = check("Your balance is $1,250.00.", [])
    assert warning_text(one) == "Please confirm this amount before relying on it: $1,250.00."
    many = check("You owe $1,250.00 and USD 30, and the fee is £9.99.", [])
    assert warning_text(many) == (
        "Please confirm these amounts before relying on them: $1,250.00, USD 30 and £9.99."
    )


def test_warning_spanish_when_answer_is_spanish() -> None:
    report = check("Hola, tu saldo es de $1.400.000 y la cuota es de 1,4 millones de pesos.", [])
    assert report.language == "es"
    assert warning_text(report) == (
        "Por favor, confirma estos montos antes de usarlos: $1.400.000 y 1,4 millones de pesos."
    )


def test_warning_language_hint_wins() -> None:
    report = check("Your balance is $30.", [])
    assert report.language == "en"
    assert warning_text(report, "es-CO").startswith("Por favor, confirma este monto")
    assert warning_text(report, "fr").startswith("Merci de confirmer")
    assert warning_text(report, "ja").startswith("Please confirm")  # no such messages


@pytest.mark.parametrize(
    ("answer", "starts"),
    [
        ("Le prix est de 1 400 € pour la semaine.", "Merci de confirmer ce montant"),
        ("O preço é 1.400 reais por mês, obrigado.", "Por favor, confirme este valor"),
        ("Der Preis ist 1.400 € für die Woche.", "Bitte bestätigen Sie diesen Betrag"),
        ("El precio es de 1.400 € por semana.", "Por favor, confirma este monto"),
        ("The price is 1,400 € for the week.", "Please confirm this amount"),
    ],
)
def test_the_warning_speaks_the_answers_language(answer: str, starts: str) -> None:
    """A French answer was warned in Spanish."""
    assert warning_text(check(answer, [])).startswith(starts)


def test_warning_is_short_deduplicated_and_capped() -> None:
    report = check(" ".join(f"${n}" for n in [*range(1, 9), 1]), [])
    assert warning_text(report) == (
        "Please confirm these amounts before relying on them: $1, $2, $3, $4, $5 and 3 more."
    )


def test_warning_empty_report() -> None:
    assert warning_text(GroundingReport((), (), "en")) == ""


# -- properties ---------------------------------------------------------------------------

PREFIXES = [("$", None), ("US$ ", "USD"), ("USD ", "USD"), ("€", "EUR"), ("R$ ", "BRL"),
            ("S/ ", "PEN"), ("COP ", "COP"), ("£", "GBP")]  # fmt: skip
SUFFIXES = [(" USD", "USD"), (" €", "EUR"), (" pesos", None), (" euros", "EUR"),
            (" dólares", None), (" COP", "COP"), ("MXN", "MXN")]  # fmt: skip
SENTENCES = ["{}", "El total es {}.", "Total: {}, thanks", "({})", "**{}**"]


def _format(value: Decimal, style: str, decimals: int) -> str:
    text = f"{value:,.{decimals}f}"
    return text.translate(str.maketrans(",.", ".,")) if style == "es" else text


money = st.decimals(min_value=0, max_value=10**10, places=2, allow_nan=False)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    value=money,
    style=st.sampled_from(["en", "es"]),
    decimals=st.integers(0, 2),
    marker=st.one_of(
        st.sampled_from(PREFIXES).map(lambda m: (m[0] + "{}", m[1])),
        st.sampled_from(SUFFIXES).map(lambda m: ("{}" + m[0], m[1])),
    ),
    sentence=st.sampled_from(SENTENCES),
)
def test_formatted_amount_round_trips(
    value: Decimal, style: str, decimals: int, marker: tuple[str, str | None], sentence: str
) -> None:
    shown = value.quantize(Decimal(1).scaleb(-decimals))
    written = marker[0].format(_format(shown, style, decimals))
    [amount] = extract_amounts(sentence.format(written))
    assert amount.value == shown
    assert amount.currency == marker[1]
    assert amount.text == written
    assert check(sentence.format(written), [json.dumps({"v": str(shown)})]).ok
    assert check(sentence.format(written), [f'{{"v": {shown}}}']).ok
    assert not check(sentence.format(written), [f'{{"v": {shown + 1}}}']).ok


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    tenths=st.integers(1, 9999),
    style=st.sampled_from(["en", "es"]),
    scale=st.sampled_from(
        [
            ("million dollars", 10**6),
            ("millones de pesos", 10**6),
            ("mil pesos", 10**3),
            ("k USD", 10**3),
        ]
    ),
)
def test_scaled_amount_round_trips(tenths: int, style: str, scale: tuple[str, int]) -> None:
    mantissa = Decimal(tenths) / 10
    text = f"{_format(mantissa, style, 1)} {scale[0]}"
    [amount] = extract_amounts(text)
    assert amount.value == mantissa * scale[1]
    assert check(text, [json.dumps({"v": int(mantissa * scale[1])})]).ok


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.one_of(
        st.dates().map(lambda d: f"{d:%d/%m/%Y} {d:%Y-%m-%d} {d:%d.%m.%Y}"),
        st.times().map(lambda t: f"at {t:%H:%M} or {t:%H:%M:%S}"),
        st.integers(100_000_000, 9_999_999_999).map(lambda n: f"call +57 {n} or {n:,}"),
        st.decimals(0, 100, places=1, allow_nan=False).map(lambda d: f"{d}% and {d} %"),
        st.tuples(st.integers(0, 99), st.integers(0, 99), st.integers(0, 99)).map(
            lambda v: "version {}.{}.{}".format(*v)
        ),
        money.map(lambda d: f"there were {d:,} people, {_format(d, 'es', 2)} visitas"),
    )
)
def test_no_amounts_without_currency(text: str) -> None:
    assert extract_amounts(text) == []
