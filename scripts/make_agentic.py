"""Write ``src/speculative/data/agentic.jsonl``: multi-turn sessions whose answers repeat earlier text.

The workload exists to evaluate model-free drafters that propose continuations of text
already seen, in the current request or in earlier ones (suffix decoding, Oliaro et al.
2025). Spec-Bench rarely rewards that; real agent and assistant traffic does, because its
outputs keep re-emitting text the system has produced before. Four categories, each a
different source of that repetition:

``agent``
    Tool-calling loops. Turn 1 lists the tools as JSON and requires one JSON object per
    step (``{"tool": ..., "arguments": {...}}`` or ``{"final_answer": ...}``); each later
    turn returns a ``Tool result: {...}``. The agent re-emits the same call skeleton every
    step, and sessions of one domain (travel, support, files, SQL, calendar, shopping,
    DevOps) share the tool schema, so earlier sessions predict later ones.
``code_edit``
    Turn 1 pastes a complete Python module and asks for an edit with the whole file back;
    later turns ask for more edits. Every answer re-emits most of the previous file.
``extract``
    Turn 1 gives a field list and one semi-structured record (invoice, job posting,
    support ticket, ...); each later turn gives another record of the same kind. Every
    answer re-emits the same JSON skeleton with new values.
``rewrite``
    Turn 1 asks for a piece of writing from given facts; later turns ask to rewrite the
    previous answer (more formal, shorter, as a list, translated once), which reuses it.

(``extract`` rather than ``extraction``: ``load_questions`` folds the MT-Bench
sub-category ``extraction`` into ``mt_bench``.)

Sessions are interleaved round-robin over the categories, because the benchmark replays
them in file order while a global cache of earlier outputs fills. Everything is written
here, by hand or from seeded lists of invented names; the output is byte-identical on
every run (one ``random.Random`` per session, seeded by a string). Question ids run from
1 (below Spec-Bench's 81-560, so ``spec-bench+agentic`` keeps ids unique).

Usage:
    python scripts/make_agentic.py            # write the file
    python scripts/make_agentic.py --check    # exit 1 if the committed file is stale
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from datetime import date, timedelta
from pathlib import Path

SEED = "agentic-v1"
OUT = Path(__file__).resolve().parent.parent / "src" / "speculative" / "data" / "agentic.jsonl"
CATEGORY_ORDER = ("agent", "code_edit", "extract", "rewrite")
MAX_TURN_CHARS = 2500
MAX_SESSION_CHARS = 6000


def rng_for(session: str) -> random.Random:
    """A generator private to one session (string seeds hash with SHA-512: stable across runs)."""
    return random.Random(f"{SEED}/{session}")


def dumps(obj) -> str:
    """Compact one-line JSON, as a tool harness would print it."""
    return json.dumps(obj, ensure_ascii=False)


# ---- shared pools of invented names ------------------------------------------------------------

FIRST = ("Amara", "Bastian", "Chiara", "Dmitri", "Elif", "Farah", "Gustavo", "Hana", "Ingrid", "Jonas",
         "Kavya", "Lukas", "Mei", "Nikolai", "Olusegun", "Priya", "Quentin", "Rosa", "Sven", "Tamsin",
         "Umar", "Valentina", "Wen", "Xavier", "Yara", "Zoltan", "Anneke", "Bruno", "Camille", "Dario",
         "Esme", "Felix", "Greta", "Hugo", "Isla", "Joaquin", "Keiko", "Leona", "Matteo", "Noor")
LAST = ("Abernathy", "Brandvold", "Castellanos", "Dunmore", "Eriksen", "Fairbanks", "Gallagher",
        "Halvorsen", "Ibarra", "Jankowski", "Kowalczyk", "Lindqvist", "Moreau", "Nakamura", "Okafor",
        "Petrakis", "Quintero", "Rasmussen", "Szabo", "Takahashi", "Underwood", "Varga", "Whitcombe",
        "Xu", "Yilmaz", "Zielinski", "Achterberg", "Bellweather", "Coutinho", "Ferreira-Lund")
COMPANIES = ("Brightwater Logistics", "Kestrel Analytics", "Halcyon Robotics", "Marlowe & Finch Architects",
             "Tidewell Foods", "Copperline Energy", "Northgate Dental Supply", "Quillstone Publishing",
             "Redfern Outdoor Gear", "Sablewood Furniture", "Lumen Harbor Software", "Oakridge Lab Services",
             "Verdant Loop Composting", "Ironbark Construction", "Pinecrest Veterinary Group",
             "Silverfin Marine", "Amberlight Studios", "Cobalt Ridge Consulting", "Foxglove Health Tech",
             "Granite Peak Insurance")
CITIES = (("Leeds", "UK"), ("Rotterdam", "NL"), ("Porto", "PT"), ("Graz", "AT"), ("Aarhus", "DK"),
          ("Lyon", "FR"), ("Bologna", "IT"), ("Tampere", "FI"), ("Gdańsk", "PL"), ("Valencia", "ES"),
          ("Cork", "IE"), ("Brno", "CZ"), ("Leipzig", "DE"), ("Ghent", "BE"))
STREETS = ("Harbour Street", "Mill Lane", "Station Road", "Kingsway", "Canal Walk", "Orchard Row",
           "Market Square", "Riverside Drive", "Foundry Yard", "Chapel Street")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
          "October", "November", "December")


def person(rng: random.Random) -> tuple[str, str]:
    return rng.choice(FIRST), rng.choice(LAST)


def domain_of(company: str) -> str:
    """An address under the reserved ``.example`` top-level domain."""
    base = company.lower().replace("&", "and").replace(" ", "")
    return base[:22] + ".example"


def phone(rng: random.Random) -> str:
    """A number from ranges reserved for fiction (UK 020 7946 0xxx, US 555-01xx)."""
    if rng.random() < 0.5:
        return f"+44 20 7946 0{rng.randint(100, 999)}"
    return f"+1 (555) 01{rng.randint(10, 99)}"


def pick(rng: random.Random, pool: tuple | list):
    """An element of ``pool`` that this session has not drawn yet (any once all are drawn)."""
    used = rng.__dict__.setdefault("drawn", set())
    fresh = [i for i in range(len(pool)) if (id(pool), i) not in used] or list(range(len(pool)))
    i = rng.choice(fresh)
    used.add((id(pool), i))
    return pool[i]


def money(x: float) -> str:
    return f"{x:,.2f}"


# ---- agent: tool-calling loops ------------------------------------------------------------------

AGENT_INTRO = """You are an assistant that completes tasks by calling tools. These tools are available:

```json
TOOLS
```

Rules: reply with ONLY one JSON object per step and no other text. To call a tool, reply \
{"tool": "<tool name>", "arguments": {<arguments>}}. I will run it and send you the result. When the task is done, \
reply {"final_answer": "<your answer for the user>"}.

Task: TASK"""

NEXT = "Next step? Reply with one JSON object only."


def tool(name: str, description: str, arguments: dict, returns: str) -> dict:
    return {"name": name, "description": description, "arguments": arguments, "returns": returns}


def tools_block(tools: list[dict]) -> str:
    """A JSON array with one tool per line."""
    return "[\n" + ",\n".join("  " + dumps(t) for t in tools) + "\n]"


AGENT_TOOLS = {
    "travel": [
        tool("search_flights", "Find flights on one day.",
             {"origin": "string, IATA airport code", "destination": "string, IATA airport code",
              "date": "string, YYYY-MM-DD", "max_stops": "integer, optional"},
             "list of flights with flight_id, airline, departure, arrival, stops, price"),
        tool("get_seat_map", "Free seats on a flight.", {"flight_id": "string"},
             "list of seats with seat, position (window/middle/aisle), extra_fee"),
        tool("book_flight", "Book one passenger on a flight.",
             {"flight_id": "string", "passenger_name": "string", "seat": "string"},
             "booking_ref, status, total_price"),
        tool("search_hotels", "Find hotels with free rooms for a stay.",
             {"city": "string", "check_in": "string, YYYY-MM-DD", "check_out": "string, YYYY-MM-DD",
              "max_price_per_night": "number, optional"},
             "list of hotels with hotel_id, name, rating, price_per_night, distance_to_centre_km"),
        tool("book_hotel", "Book a room.",
             {"hotel_id": "string", "guest_name": "string", "check_in": "string", "check_out": "string"},
             "confirmation_code, status, total_price, or an error"),
    ],
    "support": [
        tool("find_customer", "Look up a customer by email.", {"email": "string"},
             "customer_id, name, tier, customer_since"),
        tool("list_orders", "Recent orders of a customer, newest first.",
             {"customer_id": "string", "limit": "integer, optional, default 5"},
             "list of orders with order_id, placed_on, total, status"),
        tool("get_order", "Full details of one order.", {"order_id": "string"},
             "items (sku, name, quantity, unit_price), shipping, delivered_on, payment"),
        tool("issue_refund", "Refund part or all of an order to the original payment method.",
             {"order_id": "string", "amount": "number", "reason": "string"},
             "refund_id, status, expected_in_days"),
        tool("send_email", "Email a customer.", {"to": "string", "subject": "string", "body": "string"},
             "message_id, status"),
    ],
    "files": [
        tool("list_dir", "List a directory.", {"path": "string"}, "entries with name, type (file/dir), size_bytes"),
        tool("read_file", "Read a text file.", {"path": "string"}, "content"),
        tool("write_file", "Create or overwrite a text file.", {"path": "string", "content": "string"},
             "bytes_written"),
        tool("search_files", "Search text files under a directory (plain substring, case-sensitive).",
             {"path": "string", "pattern": "string"}, "matches with path, line, text"),
    ],
    "sql": [
        tool("list_tables", "Tables of the analytics database (PostgreSQL).", {}, "table names with row counts"),
        tool("describe_table", "Columns of one table.", {"table": "string"}, "columns with name, type, nullable"),
        tool("run_query", "Run one read-only SQL query; at most 50 rows come back.", {"sql": "string"},
             "columns and rows, or an error"),
    ],
    "calendar": [
        tool("list_events", "Events on a person's calendar.",
             {"person": "string, email", "start": "string, ISO datetime", "end": "string, ISO datetime"},
             "events with event_id, title, start, end, attendees"),
        tool("find_free_slots", "Slots when all attendees are free.",
             {"attendees": "list of emails", "date": "string, YYYY-MM-DD", "duration_minutes": "integer",
              "earliest": "string, HH:MM", "latest": "string, HH:MM"},
             "list of slots with start and end"),
        tool("check_room", "Whether a meeting room is free.",
             {"room": "string", "start": "string, ISO datetime", "end": "string, ISO datetime"},
             "available (bool), capacity"),
        tool("create_event", "Create an event and invite the attendees.",
             {"title": "string", "start": "string", "end": "string", "attendees": "list of emails",
              "location": "string", "description": "string, optional"},
             "event_id, status"),
        tool("update_event", "Change fields of an existing event; attendees are notified.",
             {"event_id": "string", "changes": "object with any of title, start, end, location, description"},
             "event_id, status"),
    ],
    "shopping": [
        tool("search_products", "Search the shop's catalogue.",
             {"query": "string", "max_price": "number, optional", "sort_by": "string: relevance, price or rating"},
             "products with product_id, name, price, rating, review_count"),
        tool("get_product", "Specifications of a product.", {"product_id": "string"}, "name, price, specs, in_stock"),
        tool("get_reviews", "Summary of customer reviews.", {"product_id": "string", "limit": "integer, optional"},
             "average, count, top_pros, top_cons, snippets"),
        tool("add_to_cart", "Add a product to the user's cart.", {"product_id": "string", "quantity": "integer"},
             "cart_items, cart_total"),
    ],
    "devops": [
        tool("get_service_status", "Deployment status of a service.",
             {"service": "string", "environment": "string: staging or production"},
             "status, version, replicas_ready, replicas_desired, last_deploy"),
        tool("read_logs", "Recent log lines of a service.",
             {"service": "string", "environment": "string", "since_minutes": "integer",
              "level": "string, optional: ERROR, WARN or INFO"},
             "lines (at most 20)"),
        tool("get_metric", "A metric over a time window.",
             {"service": "string", "environment": "string", "metric": "string", "window_minutes": "integer"},
             "points with time and value"),
        tool("restart_service", "Rolling restart of all replicas.", {"service": "string", "environment": "string"},
             "status, replicas_ready"),
        tool("rollback_deploy", "Redeploy an earlier version.",
             {"service": "string", "environment": "string", "to_version": "string"},
             "status, version"),
    ],
}


def agent_session(domain: str, task: str, results: list[dict]) -> list[str]:
    """Turn 1 (tools, rules, task) and one ``Tool result:`` turn per result."""
    first = AGENT_INTRO.replace("TOOLS", tools_block(AGENT_TOOLS[domain])).replace("TASK", task)
    return [first] + [f"Tool result: {dumps(r)}\n\n{NEXT}" for r in results]


def agent_sessions() -> list[tuple[str, list[str]]]:
    s = []
    s.append(("travel", agent_session(
        "travel",
        "Book the cheapest nonstop flight from Lisbon (LIS) to Copenhagen (CPH) on 2025-10-14 for Ingrid "
        "Halvorsen. She wants an aisle seat if one is free at no extra cost, otherwise any free seat. Tell me "
        "the booking reference and the total price.",
        [
            {"flights": [
                {"flight_id": "AW412-1014", "airline": "Atlantic Wing", "departure": "2025-10-14T07:05",
                 "arrival": "2025-10-14T11:55", "stops": 0, "price": {"amount": 212.40, "currency": "EUR"}},
                {"flight_id": "NL1726-1014", "airline": "Nordlys Air", "departure": "2025-10-14T13:20",
                 "arrival": "2025-10-14T18:10", "stops": 0, "price": {"amount": 189.90, "currency": "EUR"}},
                {"flight_id": "SR088-1014", "airline": "Skyreach", "departure": "2025-10-14T06:00",
                 "arrival": "2025-10-14T14:35", "stops": 1, "price": {"amount": 154.00, "currency": "EUR"}}]},
            {"flight_id": "NL1726-1014", "seats": [
                {"seat": "14C", "position": "aisle", "extra_fee": 12.00},
                {"seat": "21D", "position": "aisle", "extra_fee": 0.00},
                {"seat": "21E", "position": "middle", "extra_fee": 0.00},
                {"seat": "27A", "position": "window", "extra_fee": 0.00}]},
            {"booking_ref": "NLX7QK", "status": "confirmed", "flight_id": "NL1726-1014",
             "passenger_name": "Ingrid Halvorsen", "seat": "21D",
             "total_price": {"amount": 189.90, "currency": "EUR"}},
        ])))
    s.append(("support", agent_session(
        "support",
        "The customer olu.brandvold@mailbox.example says the ceramic pour-over kettle from their latest order "
        "arrived cracked and asks for a refund for that item only. Policy: damaged items are refunded in full "
        "if reported within 30 days of delivery; today is 2025-09-18. Check the order, refund the kettle if "
        "the policy allows it, and email the customer a short confirmation.",
        [
            {"customer_id": "C-208431", "name": "Olusegun Brandvold", "tier": "standard",
             "customer_since": "2022-03-09"},
            {"orders": [
                {"order_id": "ORD-77120", "placed_on": "2025-09-02", "total": 96.85, "status": "delivered"},
                {"order_id": "ORD-74018", "placed_on": "2025-07-21", "total": 24.00, "status": "delivered"}]},
            {"order_id": "ORD-77120", "items": [
                {"sku": "KT-CER-08", "name": "Ceramic pour-over kettle, 0.8 l", "quantity": 1, "unit_price": 54.90},
                {"sku": "FL-100", "name": "Paper filters, pack of 100", "quantity": 2, "unit_price": 6.50},
                {"sku": "CB-ETH-250", "name": "Ethiopia Guji beans, 250 g", "quantity": 2, "unit_price": 11.95}],
             "shipping": {"method": "standard", "fee": 5.05}, "delivered_on": "2025-09-06",
             "payment": {"method": "card", "last4": "4417"}},
            {"refund_id": "RF-31907", "status": "approved", "order_id": "ORD-77120", "amount": 54.90,
             "expected_in_days": 5},
            {"message_id": "msg-9f2c61", "status": "sent"},
        ])))
    s.append(("files", agent_session(
        "files",
        "In the project at /home/dev/weather-cli, find every TODO comment under src/ and write them to "
        "/home/dev/weather-cli/TODO.md as a markdown checklist grouped by file (a '## path' heading per file, "
        "then '- [ ] text (line N)'). Then tell me how many TODOs you found.",
        [
            {"entries": [
                {"name": "src", "type": "dir", "size_bytes": 0},
                {"name": "tests", "type": "dir", "size_bytes": 0},
                {"name": "README.md", "type": "file", "size_bytes": 2210},
                {"name": "pyproject.toml", "type": "file", "size_bytes": 734}]},
            {"matches": [
                {"path": "src/weather_cli/api.py", "line": 42, "text": "# TODO: retry on HTTP 429 with backoff"},
                {"path": "src/weather_cli/api.py", "line": 88, "text": "# TODO: cache responses for 10 minutes"},
                {"path": "src/weather_cli/format.py", "line": 17,
                 "text": "# TODO: support Fahrenheit output via --units"},
                {"path": "src/weather_cli/main.py", "line": 5, "text": "# TODO: read default city from config"},
                {"path": "src/weather_cli/main.py", "line": 61,
                 "text": "# TODO: exit with code 2 on unknown city"}]},
            {"bytes_written": 388},
        ])))
    s.append(("sql", agent_session(
        "sql",
        "Which five products had the highest revenue in the second quarter of 2025 (April to June)? Count only "
        "orders that were not cancelled. Give product name and revenue rounded to two decimals.",
        [
            {"tables": [{"name": "customers", "rows": 18422}, {"name": "orders", "rows": 96310},
                        {"name": "order_items", "rows": 241877}, {"name": "products", "rows": 612}]},
            {"table": "order_items", "columns": [
                {"name": "order_id", "type": "bigint", "nullable": False},
                {"name": "product_id", "type": "integer", "nullable": False},
                {"name": "quantity", "type": "integer", "nullable": False},
                {"name": "unit_price", "type": "numeric(10,2)", "nullable": False}]},
            {"table": "orders", "columns": [
                {"name": "order_id", "type": "bigint", "nullable": False},
                {"name": "customer_id", "type": "integer", "nullable": False},
                {"name": "created_at", "type": "timestamp", "nullable": False},
                {"name": "status", "type": "text", "nullable": False}]},
            {"columns": ["name", "revenue"], "rows": [
                ["Trail running vest 12 l", 48211.40], ["Merino base layer, men", 41980.00],
                ["Ultralight tent 2p", 39655.50], ["Insulated bottle 750 ml", 31204.25],
                ["Headlamp 400 lm", 28870.10]]},
        ])))
    s.append(("calendar", agent_session(
        "calendar",
        "Set up a 45-minute design review of the new checkout flow with priya.okafor@tidewellfoods.example, "
        "lukas.varga@tidewellfoods.example and me (hana.takahashi@tidewellfoods.example) on Thursday "
        "2025-10-09, between 10:00 and 16:00. Book room Juniper if it is free, otherwise make it a video call. "
        "Put the link to the prototype, https://proto.tidewellfoods.example/checkout-v3, in the description.",
        [
            {"slots": [{"start": "2025-10-09T11:15", "end": "2025-10-09T12:00"},
                       {"start": "2025-10-09T14:30", "end": "2025-10-09T15:15"}]},
            {"room": "Juniper", "available": False, "capacity": 6},
            {"room": "Juniper", "available": True, "capacity": 6},
            {"event_id": "evt_5521ab", "status": "created"},
        ])))
    s.append(("shopping", agent_session(
        "shopping",
        "Compare the two best-rated cordless stick vacuums under 300 EUR on battery life, weight and noise, "
        "then add the better one for a small flat with hard floors to my cart. Explain the choice in two "
        "sentences.",
        [
            {"products": [
                {"product_id": "VAC-2281", "name": "Zephyr S9 Cordless", "price": 279.00, "rating": 4.6,
                 "review_count": 1342},
                {"product_id": "VAC-1907", "name": "Kora Lite 2", "price": 189.99, "rating": 4.5,
                 "review_count": 877},
                {"product_id": "VAC-3310", "name": "Brisa Max Pet", "price": 299.00, "rating": 4.2,
                 "review_count": 415}]},
            {"product_id": "VAC-2281", "name": "Zephyr S9 Cordless", "price": 279.00, "in_stock": True,
             "specs": {"battery_minutes": 55, "weight_kg": 2.9, "noise_db": 79, "bin_litres": 0.6,
                       "floor_heads": ["carpet", "soft roller"]}},
            {"product_id": "VAC-1907", "name": "Kora Lite 2", "price": 189.99, "in_stock": True,
             "specs": {"battery_minutes": 40, "weight_kg": 1.8, "noise_db": 72, "bin_litres": 0.4,
                       "floor_heads": ["soft roller"]}},
            {"cart_items": 1, "cart_total": 189.99},
        ])))
    s.append(("devops", agent_session(
        "devops",
        "payments-api in production started returning 502s about 20 minutes ago. Find out why and fix it if a "
        "restart or a rollback is enough. Report what you found and what you did.",
        [
            {"service": "payments-api", "environment": "production", "status": "degraded", "version": "2.18.0",
             "replicas_ready": 1, "replicas_desired": 4, "last_deploy": "2025-09-30T09:41:12Z"},
            {"lines": [
                "2025-09-30T09:42:03Z ERROR config: required setting PROVIDER_TIMEOUT_MS is not set",
                "2025-09-30T09:42:03Z ERROR worker exited with code 3 during startup",
                "2025-09-30T09:43:40Z ERROR config: required setting PROVIDER_TIMEOUT_MS is not set",
                "2025-09-30T09:43:40Z ERROR worker exited with code 3 during startup",
                "2025-09-30T09:51:17Z WARN upstream pool has 1 healthy backend of 4"]},
            {"status": "rolled_back", "version": "2.17.3"},
            {"service": "payments-api", "environment": "production", "status": "healthy", "version": "2.17.3",
             "replicas_ready": 4, "replicas_desired": 4, "last_deploy": "2025-09-30T10:03:55Z"},
        ])))
    s.append(("travel", agent_session(
        "travel",
        "Find a hotel in Kraków from 2025-11-03 to 2025-11-06 under 120 EUR per night, rated at least 4.0, as "
        "close to the centre as possible, and book it for Tomasz Jankowski. Reply with the hotel, the "
        "confirmation code and the total price.",
        [
            {"hotels": [
                {"hotel_id": "KRK-0192", "name": "Hotel Wawel Gate", "rating": 4.4, "price_per_night": 118.00,
                 "distance_to_centre_km": 0.3},
                {"hotel_id": "KRK-0417", "name": "Vistula Loft Rooms", "rating": 4.1, "price_per_night": 92.50,
                 "distance_to_centre_km": 0.9},
                {"hotel_id": "KRK-0088", "name": "Kazimierz Courtyard", "rating": 3.8, "price_per_night": 74.00,
                 "distance_to_centre_km": 1.2}]},
            {"error": "room_unavailable", "message": "The last room at KRK-0192 for these dates was just taken."},
            {"confirmation_code": "VLR-558203", "status": "confirmed", "hotel_id": "KRK-0417",
             "guest_name": "Tomasz Jankowski", "check_in": "2025-11-03", "check_out": "2025-11-06",
             "total_price": {"amount": 277.50, "currency": "EUR"}},
        ])))
    s.append(("support", agent_session(
        "support",
        "Order ORD-80554 was promised for delivery by 2025-10-02 and the customer asks where it is. If it is "
        "more than 5 days late today (2025-10-09), refund the shipping fee as an apology. Email the customer "
        "the tracking status and what you did.",
        [
            {"order_id": "ORD-80554", "customer_email": "e.yilmaz@postbox.example", "items": [
                {"sku": "DL-OAK-120", "name": "Oak desk lamp", "quantity": 1, "unit_price": 64.00}],
             "shipping": {"method": "express", "fee": 9.90, "carrier": "ParcelLine", "tracking": "PL4410982217",
                          "last_scan": "2025-10-01, held at Leeds depot: address label damaged"},
             "delivered_on": None, "payment": {"method": "paypal"}},
            {"refund_id": "RF-33402", "status": "approved", "order_id": "ORD-80554", "amount": 9.90,
             "expected_in_days": 3},
            {"message_id": "msg-a04e77", "status": "sent"},
        ])))
    s.append(("files", agent_session(
        "files",
        "Bump the version of the package in /srv/app/invoice-tool from 1.4.2 to 1.5.0 in every file that "
        "states it. Do not touch CHANGELOG.md entries of earlier releases. Tell me which files you changed.",
        [
            {"matches": [
                {"path": "/srv/app/invoice-tool/pyproject.toml", "line": 3, "text": "version = \"1.4.2\""},
                {"path": "/srv/app/invoice-tool/src/invoice_tool/__init__.py", "line": 1,
                 "text": "__version__ = \"1.4.2\""},
                {"path": "/srv/app/invoice-tool/CHANGELOG.md", "line": 9, "text": "## 1.4.2 - 2025-06-30"}]},
            {"content": "[project]\nname = \"invoice-tool\"\nversion = \"1.4.2\"\ndescription = \"Generate PDF "
                        "invoices from YAML\"\nrequires-python = \">=3.10\"\ndependencies = [\"pyyaml>=6\", "
                        "\"reportlab>=4\"]\n\n[project.scripts]\ninvoice-tool = \"invoice_tool.cli:main\"\n"},
            {"bytes_written": 228},
            {"content": "__version__ = \"1.4.2\"\n\nfrom .model import Invoice, LineItem\nfrom .render import "
                        "render_pdf\n\n__all__ = [\"Invoice\", \"LineItem\", \"render_pdf\", \"__version__\"]\n"},
            {"bytes_written": 155},
        ])))
    s.append(("sql", agent_session(
        "sql",
        "For each month of 2025 so far, how many customers placed their first ever order in that month? "
        "Which month had the most new customers?",
        [
            {"table": "orders", "columns": [
                {"name": "order_id", "type": "bigint", "nullable": False},
                {"name": "customer_id", "type": "integer", "nullable": False},
                {"name": "created_at", "type": "timestamp", "nullable": False},
                {"name": "status", "type": "text", "nullable": False}]},
            {"error": "ERROR: column \"order_date\" does not exist", "position": 42},
            {"columns": ["month", "new_customers"], "rows": [
                ["2025-01", 1204], ["2025-02", 1131], ["2025-03", 1387], ["2025-04", 1452], ["2025-05", 1610],
                ["2025-06", 1298], ["2025-07", 1175], ["2025-08", 1233], ["2025-09", 1401]]},
        ])))
    s.append(("calendar", agent_session(
        "calendar",
        "My 1:1 with sven.lindqvist@copperline.example on Monday 2025-10-13 clashes with the all-hands. Move "
        "the 1:1 to the first 30-minute slot after 13:00 that day when we are both free, and add a line to its "
        "description saying it moved because of the all-hands. I am dario.moreau@copperline.example.",
        [
            {"events": [
                {"event_id": "evt_11c0de", "title": "All-hands Q4 kickoff", "start": "2025-10-13T10:00",
                 "end": "2025-10-13T11:30", "attendees": ["all@copperline.example"]},
                {"event_id": "evt_7e31f2", "title": "1:1 Dario / Sven", "start": "2025-10-13T10:30",
                 "end": "2025-10-13T11:00",
                 "attendees": ["dario.moreau@copperline.example", "sven.lindqvist@copperline.example"]},
                {"event_id": "evt_90aa13", "title": "Budget review", "start": "2025-10-13T13:00",
                 "end": "2025-10-13T14:00", "attendees": ["dario.moreau@copperline.example"]}]},
            {"slots": [{"start": "2025-10-13T14:00", "end": "2025-10-13T14:30"},
                       {"start": "2025-10-13T16:00", "end": "2025-10-13T16:30"}]},
            {"event_id": "evt_7e31f2", "status": "updated"},
        ])))
    s.append(("shopping", agent_session(
        "shopping",
        "I need a 27-inch USB-C monitor that delivers at least 65 W to charge my laptop, under 350 EUR. Pick "
        "the best reviewed one that meets this and add one to my cart.",
        [
            {"products": [
                {"product_id": "MON-5102", "name": "Vantor 27Q USB-C", "price": 329.00, "rating": 4.5,
                 "review_count": 602},
                {"product_id": "MON-4478", "name": "Pixelane P27 Hub", "price": 299.00, "rating": 4.6,
                 "review_count": 288},
                {"product_id": "MON-3920", "name": "Orla 27 Office", "price": 239.00, "rating": 4.3,
                 "review_count": 1190}]},
            {"product_id": "MON-4478", "name": "Pixelane P27 Hub", "price": 299.00, "in_stock": True,
             "specs": {"size_inches": 27, "resolution": "2560x1440", "usb_c_power_delivery_w": 45,
                       "ports": ["USB-C", "HDMI", "2x USB-A"]}},
            {"product_id": "MON-5102", "name": "Vantor 27Q USB-C", "price": 329.00, "in_stock": True,
             "specs": {"size_inches": 27, "resolution": "2560x1440", "usb_c_power_delivery_w": 90,
                       "ports": ["USB-C", "DisplayPort", "HDMI", "3x USB-A", "Ethernet"]}},
            {"product_id": "MON-5102", "average": 4.5, "count": 602,
             "top_pros": ["charges laptop at full speed", "sharp text"], "top_cons": ["stand wobbles a little"],
             "snippets": ["One cable for power, screen and network - my desk is finally tidy."]},
            {"cart_items": 1, "cart_total": 329.00},
        ])))
    s.append(("devops", agent_session(
        "devops",
        "thumbnail-worker in staging keeps crashing. Check it and restart it if it looks like a stuck state. "
        "Do not roll back without asking me. Tell me the cause and what you did.",
        [
            {"service": "thumbnail-worker", "environment": "staging", "status": "crash_loop", "version": "0.9.4",
             "replicas_ready": 0, "replicas_desired": 2, "last_deploy": "2025-09-22T16:05:00Z"},
            {"lines": [
                "2025-10-01T08:12:44Z ERROR failed to write /tmp/thumbs/8812.webp: No space left on device",
                "2025-10-01T08:12:44Z ERROR worker crashed: OSError(28)",
                "2025-10-01T08:13:10Z WARN /tmp usage 100% (1.0 GiB of 1.0 GiB)"]},
            {"points": [{"time": "2025-09-30T20:00Z", "value": 0.41}, {"time": "2025-10-01T02:00Z", "value": 0.77},
                        {"time": "2025-10-01T08:00Z", "value": 1.0}], "metric": "tmp_disk_used_fraction"},
            {"status": "restarted", "replicas_ready": 2},
        ])))
    return [(f"agent-{d}-{sum(1 for e, _ in s[: i + 1] if e == d):02d}", t) for i, (d, t) in enumerate(s)]


# ---- code_edit: whole-file edits ----------------------------------------------------------------

# (file name, source, first request, later requests). Some files carry a small bug on purpose, which a
# later turn describes the way a user would (a symptom, not the fix).
CODE_FILES = [
    ("inventory", "inventory.py", r'''"""Stock levels for a small warehouse."""

from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    unit_cost: float
    reorder_level: int = 5


class Inventory:
    def __init__(self):
        self.items = {}

    def add_item(self, sku, name, quantity, unit_cost, reorder_level=5):
        if sku in self.items:
            raise ValueError(f"duplicate sku {sku}")
        self.items[sku] = Item(sku, name, quantity, unit_cost, reorder_level)

    def receive(self, sku, quantity):
        self.items[sku].quantity += quantity

    def ship(self, sku, quantity):
        item = self.items[sku]
        item.quantity -= quantity
        return item.quantity

    def low_stock(self):
        return [i for i in self.items.values() if i.quantity <= i.reorder_level]

    def total_value(self):
        return sum(i.quantity * i.unit_cost for i in self.items.values())


if __name__ == "__main__":
    inv = Inventory()
    inv.add_item("BX-100", "Cardboard box, small", 120, 0.35)
    inv.add_item("TP-050", "Packing tape", 8, 2.10, reorder_level=10)
    inv.ship("BX-100", 30)
    print([i.name for i in inv.low_stock()], round(inv.total_value(), 2))
''',
     "Here is inventory.py from our warehouse tool. Add a method `restock_report()` that returns one line per "
     "low-stock item, sorted by name, formatted like `TP-050 Packing tape: 8 left (reorder at 10)`. Return the "
     "complete updated file.",
     ["ship() lets the quantity go negative when we ship more than we have. Make it raise a ValueError with a "
      "clear message instead, and return the whole file again.",
      "Now rename the class Inventory to StockBook everywhere (including the example at the bottom) and return "
      "the complete file.",
      "Add type hints to every function and method. Return the complete file."]),
    ("csv_report", "sales_report.py", r'''import csv
import sys
from collections import defaultdict


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def summarize(rows):
    totals = defaultdict(float)
    counts = defaultdict(int)
    for row in rows:
        region = row["region"].strip()
        totals[region] += float(row["amount"])
        counts[region] += 1
    return totals, counts


def write_summary(totals, counts, out):
    writer = csv.writer(out)
    writer.writerow(["region", "orders", "revenue"])
    for region in sorted(totals):
        writer.writerow([region, counts[region], f"{totals[region]:.2f}"])


def main(argv):
    if len(argv) != 2:
        print("usage: sales_report.py SALES.csv", file=sys.stderr)
        return 2
    totals, counts = summarize(read_rows(argv[1]))
    write_summary(totals, counts, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
''',
     "This script summarizes a sales CSV by region. Can you add an `average_order` column (revenue divided by "
     "orders, two decimals) after revenue? Please return the complete updated file.",
     ["Rows with an empty amount crash the script. Skip them, and print how many were skipped to stderr at the "
      "end. Whole file again please.",
      "Rename summarize to summarize_by_region and write_summary to write_region_csv everywhere, and return the "
      "complete file.",
      "Add a short docstring to each function and a module docstring. Return the complete file."]),
    ("rate_limiter", "rate_limiter.py", r'''import time


class TokenBucket:
    """Allows `rate` requests per second on average, with bursts up to `capacity`."""

    def __init__(self, rate, capacity, clock=time.monotonic):
        self.rate = rate
        self.capacity = capacity
        self.clock = clock
        self.tokens = capacity
        self.updated = clock()

    def _refill(self):
        now = self.clock()
        elapsed = now - self.updated
        self.tokens = self.tokens + elapsed * self.rate
        self.updated = now

    def allow(self, cost=1):
        self._refill()
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False


class KeyedLimiter:
    """One bucket per key (user id, IP address, API token)."""

    def __init__(self, rate, capacity):
        self.rate = rate
        self.capacity = capacity
        self.buckets = {}

    def allow(self, key, cost=1):
        bucket = self.buckets.get(key)
        if bucket is None:
            bucket = self.buckets[key] = TokenBucket(self.rate, self.capacity)
        return bucket.allow(cost)


if __name__ == "__main__":
    limiter = KeyedLimiter(rate=2, capacity=5)
    results = [limiter.allow("10.0.0.7") for _ in range(8)]
    print(results)
''',
     "After a client is idle for a while our rate limiter lets through a huge burst, way more than `capacity`. "
     "Please fix rate_limiter.py and return the complete corrected file.",
     ["Add a method `wait_time(cost=1)` to TokenBucket that returns how many seconds until `allow(cost)` would "
      "succeed (0.0 if it would succeed now). Return the whole file.",
      "KeyedLimiter never forgets keys. Add an `evict_idle(max_idle_seconds)` method that drops buckets not used "
      "for that long, and return the complete file."]),
    ("config_loader", "config_loader.py", r'''import os


class ConfigError(Exception):
    pass


class Config:
    def __init__(self, sections):
        self.sections = sections

    def get(self, section, key, default=None):
        env_name = f"APP_{section}_{key}".upper()
        if env_name in os.environ:
            return os.environ[env_name]
        return self.sections.get(section, {}).get(key, default)


def parse(text):
    sections = {}
    current = None
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1].strip()
            sections.setdefault(current, {})
            continue
        if "=" not in line:
            raise ConfigError(f"line {number}: expected key = value")
        if current is None:
            raise ConfigError(f"line {number}: key outside of a section")
        key, value = line.split("=", 1)
        sections[current][key.strip()] = value.strip()
    return Config(sections)


def load(path):
    with open(path, encoding="utf-8") as f:
        return parse(f.read())


if __name__ == "__main__":
    cfg = parse("[server]\nhost = 0.0.0.0\nport = 8080\n\n[db]\nurl = postgres://localhost/app\n")
    print(cfg.get("server", "port"), cfg.get("db", "url"))
''',
     "That's our little config loader. I want lines starting with `;` to count as comments too, and inline "
     "comments after ` #` should be stripped from values. Return the complete updated file please.",
     ["Add `get_int(section, key, default=None)` and `get_bool(section, key, default=None)` to Config. get_bool "
      "should accept true/false/yes/no/on/off/1/0 in any case and raise ConfigError otherwise. Whole file again.",
      "Now rename ConfigError to ConfigSyntaxError everywhere and return the complete file.",
      "Add type hints throughout and return the complete file."]),
    ("text_stats", "text_stats.py", r'''import re
from collections import Counter

WORD = re.compile(r"[A-Za-z']+")
SENTENCE_END = re.compile(r"[.!?]+")


def words(text):
    return [w.lower() for w in WORD.findall(text)]


def sentence_count(text):
    parts = [p for p in SENTENCE_END.split(text) if p.strip()]
    return max(1, len(parts))


def average_word_length(text):
    ws = words(text)
    if not ws:
        return 0.0
    return sum(len(w) for w in ws) / len(ws)


def top_words(text, n=10):
    return Counter(words(text)).most_common(n)


def summary(text):
    ws = words(text)
    return {
        "words": len(ws),
        "unique_words": len(set(ws)),
        "sentences": sentence_count(text),
        "avg_word_length": round(average_word_length(text), 2),
        "words_per_sentence": round(len(ws) / sentence_count(text), 2),
    }


if __name__ == "__main__":
    sample = "The river was high. Boats stayed in the harbour! Did the ferry run? It did not."
    print(summary(sample))
    print(top_words(sample, 3))
''',
     "I use this module to get quick statistics on articles. Make top_words ignore common English stopwords "
     "(use a small set of about 25 in a module constant STOPWORDS). Return the complete updated file.",
     ["Add a function `longest_words(text, n=5)` that returns the n longest distinct words, longest first, ties "
      "in alphabetical order, and include it in the __main__ demo. Return the whole file.",
      "Add docstrings to every function and return the complete file.",
      "Add type hints everywhere as well and return the complete file one more time."]),
    ("lru_cache", "lru.py", r'''from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self.data = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key, default=None):
        if key in self.data:
            self.hits += 1
            self.data.move_to_end(key)
            return self.data[key]
        self.misses += 1
        return default

    def put(self, key, value):
        self.data[key] = value
        if len(self.data) > self.capacity:
            self.data.popitem(last=False)

    def __len__(self):
        return len(self.data)

    def __contains__(self, key):
        return key in self.data

    def hit_rate(self):
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


if __name__ == "__main__":
    cache = LRUCache(2)
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("a", 10)
    cache.put("c", 3)
    print("a" in cache, "b" in cache, cache.get("a"), cache.hit_rate())
''',
     "Our LRU cache evicts the wrong entry: after updating an existing key with put(), that key still gets "
     "evicted first. In the demo at the bottom 'a' should survive and 'b' should be evicted. Please fix it and "
     "return the complete file.",
     ["Add a `resize(new_capacity)` method that evicts least recently used entries if the cache shrinks, and a "
      "`clear()` that also resets the hit/miss counters. Return the whole file.",
      "Rename the class to BoundedCache everywhere and add docstrings to the class and every method. Return the "
      "complete file.",
      "Finally add type hints, using generics (TypeVar K and V) so BoundedCache[str, int] works. Complete file "
      "again please."]),
    ("ledger", "ledger.py", r'''from datetime import date


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, number, owner):
        self.number = number
        self.owner = owner
        self.balance = 0.0
        self.history = []

    def _record(self, kind, amount, memo):
        self.history.append((date.today().isoformat(), kind, amount, self.balance, memo))

    def deposit(self, amount, memo=""):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self._record("deposit", amount, memo)

    def withdraw(self, amount, memo=""):
        if amount > self.balance:
            raise InsufficientFunds(f"{self.number}: balance {self.balance:.2f}, asked {amount:.2f}")
        self.balance -= amount
        self._record("withdrawal", amount, memo)


class Ledger:
    def __init__(self):
        self.accounts = {}

    def open(self, number, owner):
        self.accounts[number] = Account(number, owner)
        return self.accounts[number]

    def transfer(self, src, dst, amount, memo=""):
        self.accounts[src].withdraw(amount, memo or f"to {dst}")
        self.accounts[dst].deposit(amount, memo or f"from {src}")

    def statement(self, number):
        lines = [f"Statement for {number}"]
        for day, kind, amount, balance, memo in self.accounts[number].history:
            lines.append(f"{day}  {kind:<10} {amount:>10.2f} {balance:>10.2f}  {memo}")
        return "\n".join(lines)


if __name__ == "__main__":
    ledger = Ledger()
    ledger.open("A-1", "Rosa")
    ledger.open("A-2", "Jonas")
    ledger.accounts["A-1"].deposit(100.10)
    ledger.transfer("A-1", "A-2", 40.05)
    print(ledger.statement("A-1"))
''',
     "This is a toy ledger for a workshop. Switch all money amounts from float to decimal.Decimal (accept str, "
     "int or Decimal in deposit/withdraw/transfer and convert) so balances stay exact, no 0.1 + 0.2 surprises. "
     "Return the complete updated file.",
     ["withdraw() accepts zero and negative amounts, which is wrong. Make it reject them like deposit does. "
      "Return the whole file.",
      "Add an optional overdraft_limit to Account (default 0) that withdraw respects, and let Ledger.open take it "
      "too. Complete file please.",
      "Rename Ledger to Bank and statement to print_statement everywhere, then return the complete file."]),
    ("task_queue", "task_queue.py", r'''import heapq
import itertools
from dataclasses import dataclass, field


@dataclass
class Task:
    priority: int
    name: str
    payload: dict = field(default_factory=dict)
    attempts: int = 0

    def __lt__(self, other):
        return self.priority < other.priority


class TaskQueue:
    def __init__(self, max_attempts=3):
        self.heap = []
        self.failed = []
        self.max_attempts = max_attempts
        self.ids = itertools.count()

    def push(self, task):
        heapq.heappush(self.heap, task)

    def pop(self):
        if not self.heap:
            return None
        return heapq.heappop(self.heap)

    def retry(self, task, error):
        task.attempts += 1
        if task.attempts >= self.max_attempts:
            self.failed.append((task, str(error)))
        else:
            self.push(task)

    def __len__(self):
        return len(self.heap)


def run(queue, handler):
    done = 0
    while (task := queue.pop()) is not None:
        try:
            handler(task)
            done += 1
        except Exception as exc:
            queue.retry(task, exc)
    return done


if __name__ == "__main__":
    q = TaskQueue()
    for i, name in enumerate(["resize", "email", "backup", "email", "thumbnail", "report"]):
        q.push(Task(priority=1 if name == "email" else 2, name=f"{name}-{i}"))
    print(run(q, lambda t: print("running", t.name)))
''',
     "Tasks with the same priority don't come out of this queue in the order they were pushed (the demo runs "
     "resize-0 last); I need them FIFO within a priority (the `ids` counter was meant for that but it's never "
     "used). Fix it and return the complete file.",
     ["Add a `peek()` method that returns the next task without removing it (None if empty), and make pop() skip "
      "tasks whose name was passed to a new `cancel(name)` method. Return the whole file.",
      "Add docstrings to Task, TaskQueue, each method and run(). Return the complete file."]),
    ("units", "units.py", r'''LENGTH = {"mm": 0.001, "cm": 0.01, "m": 1.0, "km": 1000.0, "in": 0.0254, "ft": 0.3048, "mi": 1609.344}
MASS = {"g": 0.001, "kg": 1.0, "t": 1000.0, "oz": 0.028349523125, "lb": 0.45359237}
TEMPERATURE = ("c", "f", "k")


def _to_kelvin(value, unit):
    if unit == "c":
        return value + 273.15
    if unit == "f":
        return (value - 32) * 5 / 9 + 273.15
    return value


def _from_kelvin(value, unit):
    if unit == "c":
        return value - 273.15
    if unit == "f":
        return (value - 273.15) * 9 / 5 + 32
    return value


def convert(value, src, dst):
    src, dst = src.lower(), dst.lower()
    if src in TEMPERATURE and dst in TEMPERATURE:
        return _from_kelvin(_to_kelvin(value, src), dst)
    for table in (LENGTH, MASS):
        if src in table and dst in table:
            return value * table[src] / table[dst]
    raise ValueError(f"cannot convert {src} to {dst}")


def parse_quantity(text):
    number, unit = text.strip().split()
    return float(number), unit


if __name__ == "__main__":
    print(round(convert(5, "km", "mi"), 3))
    print(round(convert(98.6, "F", "C"), 1))
    print(convert(*parse_quantity("12 oz"), "g"))
''',
     "Please add volume units to units.py: ml, l, tsp, tbsp, cup (US, 236.588 ml), fl_oz (US) and gal (US), "
     "converting through litres like the other tables. Return the complete updated file.",
     ["Replace the ValueError with a custom UnitError (subclass of ValueError) whose message lists which units "
      "the source can be converted to. Return the whole file.",
      "parse_quantity fails on '12oz' and '1.5 kg ' with extra spaces. Make it accept an optional space between "
      "number and unit using a regex. Complete file again.",
      "Add type hints and docstrings to every function. Return the complete file."]),
    ("md_table", "md_table.py", r'''def _cell(value):
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value).replace("|", "\\|")


def format_table(headers, rows):
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    lines = []
    lines.append("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    lines.append("| " + " | ".join("-" * w for w in widths) + " |")
    for row in cells:
        lines.append("| " + " | ".join(v.ljust(w) for v, w in zip(row, widths)) + " |")
    return "\n".join(lines)


def from_csv_text(text, delimiter=","):
    lines = [line for line in text.splitlines() if line.strip()]
    headers = [h.strip() for h in lines[0].split(delimiter)]
    rows = [[v.strip() for v in line.split(delimiter)] for line in lines[1:]]
    return format_table(headers, rows)


if __name__ == "__main__":
    print(format_table(["city", "population", "area_km2"],
                       [["Graz", 291072, 127.6], ["Brno", 382405, 230.2], ["Cork", 224004, None]]))
    print(from_csv_text("name,score\nAda,9.5\nLin,8.25\n"))
''',
     "I use this to turn data into markdown tables. Numbers (int and float) should be right-aligned, with the "
     "separator row using `---:` style for those columns. Return the complete updated file.",
     ["Rows shorter than the header crash format_table. Pad them with empty cells, and raise ValueError if a row "
      "is longer than the header. Return the whole file.",
      "Add `from_dicts(records, columns=None)` that builds the table from a list of dicts (columns default to "
      "the keys of the first record, in order). Complete file please.",
      "Add docstrings to all public functions and return the complete file."]),
    ("retry", "retry.py", r'''import functools
import time


class RetryError(Exception):
    def __init__(self, attempts, last):
        super().__init__(f"gave up after {attempts} attempts: {last!r}")
        self.attempts = attempts
        self.last = last


def retry(attempts=3, delay=0.5, backoff=2.0, exceptions=(Exception,), sleep=time.sleep):
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            wait = delay
            last = None
            for attempt in range(1, attempts + 1):
                try:
                    return func(*args, **kwargs)
                except exceptions as exc:
                    last = exc
                    if attempt == attempts:
                        break
                    sleep(wait)
                    wait = delay * backoff
            raise RetryError(attempts, last)

        return wrapper

    return decorator


if __name__ == "__main__":
    calls = []

    @retry(attempts=4, delay=0.1, sleep=lambda s: calls.append(s))
    def flaky():
        if len(calls) < 3:
            raise ConnectionError("reset by peer")
        return "ok"

    print(flaky(), calls)
''',
     "The backoff in this retry decorator doesn't grow: the demo sleeps 0.1, 0.2, 0.2 instead of 0.1, 0.2, 0.4. "
     "Fix it and return the complete file.",
     ["Add a `jitter` parameter (default 0.0): each sleep is multiplied by a random factor in [1 - jitter, "
      "1 + jitter]. Take an optional `rng` (a random.Random) so tests can make it deterministic. Whole file "
      "please.",
      "Also log each failed attempt with the logging module (logger named after the module) at WARNING, "
      "including the attempt number and the exception. Complete file again.",
      "Add type hints, using ParamSpec and TypeVar so the decorated function keeps its signature. Return the "
      "complete file."]),
    ("tokenizer", "tokenizer.py", r'''import re
from typing import NamedTuple


class Token(NamedTuple):
    kind: str
    text: str
    line: int
    column: int


SPEC = [
    ("NUMBER", r"\d+(?:\.\d+)?"),
    ("NAME", r"[A-Za-z_][A-Za-z0-9_]*"),
    ("OP", r"==|!=|<=|>=|[+\-*/=<>()]"),
    ("NEWLINE", r"\n"),
    ("SKIP", r"[ \t]+"),
    ("MISMATCH", r"."),
]
PATTERN = re.compile("|".join(f"(?P<{name}>{regex})" for name, regex in SPEC))
KEYWORDS = {"if", "else", "while", "print", "let"}


class TokenizeError(Exception):
    pass


def tokenize(source):
    line, line_start = 1, 0
    for match in PATTERN.finditer(source):
        kind, text = match.lastgroup, match.group()
        column = match.start() - line_start + 1
        if kind == "NEWLINE":
            line, line_start = line + 1, match.end()
            continue
        if kind == "SKIP":
            continue
        if kind == "MISMATCH":
            raise TokenizeError(f"unexpected {text!r} at {line}:{column}")
        if kind == "NAME" and text in KEYWORDS:
            kind = "KEYWORD"
        yield Token(kind, text, line, column)


if __name__ == "__main__":
    program = "let x = 3.5\nif x >= 2 print(x * 10)\n"
    for token in tokenize(program):
        print(token)
''',
     "This is the tokenizer for a tiny teaching language. Add string literals in double quotes with backslash "
     "escapes (kind STRING, the token text without the quotes, escapes resolved for \\n, \\t, \\\" and \\\\). "
     "Return the complete updated file.",
     ["Add `#` comments that run to the end of the line (skipped, like whitespace). Return the whole file.",
      "Rename tokenize to lex and TokenizeError to LexError everywhere. Complete file please.",
      "Add docstrings to the module, Token, LexError and lex, then return the complete file."]),
    ("url_router", "router.py", r'''import re


class NotFound(Exception):
    pass


class Router:
    def __init__(self):
        self.routes = []

    def add(self, method, pattern, handler):
        regex = "^" + re.sub(r"<(\w+)>", r"(?P<\1>[^/]+)", pattern) + "$"
        self.routes.append((method.upper(), re.compile(regex), handler))

    def route(self, method, pattern):
        def decorator(handler):
            self.add(method, pattern, handler)
            return handler
        return decorator

    def dispatch(self, method, path):
        for route_method, regex, handler in self.routes:
            match = regex.match(path)
            if match and route_method == method.upper():
                return handler(**match.groupdict())
        raise NotFound(f"{method} {path}")


app = Router()


@app.route("GET", "/users/<user_id>")
def show_user(user_id):
    return {"user": user_id}


@app.route("GET", "/users/<user_id>/orders/<order_id>")
def show_order(user_id, order_id):
    return {"user": user_id, "order": order_id}


@app.route("DELETE", "/users/<user_id>")
def delete_user(user_id):
    return {"deleted": user_id}


if __name__ == "__main__":
    print(app.dispatch("GET", "/users/42/orders/7"))
    print(app.dispatch("delete", "/users/42"))
''',
     "I wrote this tiny router for a side project. Add typed parameters: `<int:order_id>` should only match "
     "digits and pass an int to the handler, `<name>` stays a string. Update show_order to use `<int:order_id>`. "
     "Return the complete updated file.",
     ["When the path matches but the method doesn't, raise a MethodNotAllowed exception that lists the allowed "
      "methods, instead of NotFound. Whole file please.",
      "Make trailing slashes optional (`/users/42/` should match `/users/<user_id>`). Return the complete file.",
      "Add type hints throughout and return the complete file."]),
    ("log_parser", "access_log.py", r'''import re
import sys
from collections import Counter

LINE = re.compile(
    r'(?P<ip>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>\w+) (?P<path>\S+) [^"]*" '
    r"(?P<status>\d{3}) (?P<size>\d+|-) (?P<ms>\d+)"
)


def parse_line(line):
    match = LINE.match(line)
    if match is None:
        raise ValueError(f"unparseable line: {line[:60]!r}")
    entry = match.groupdict()
    entry["status"] = int(entry["status"])
    entry["size"] = 0 if entry["size"] == "-" else int(entry["size"])
    entry["ms"] = int(entry["ms"])
    return entry


def analyze(lines):
    entries = [parse_line(line) for line in lines if line.strip()]
    statuses = Counter(e["status"] for e in entries)
    by_path = {}
    for e in entries:
        by_path.setdefault(e["path"], []).append(e["ms"])
    slowest = sorted(by_path, key=lambda p: max(by_path[p]), reverse=True)[:5]
    return {
        "requests": len(entries),
        "errors": sum(n for s, n in statuses.items() if s >= 500),
        "statuses": dict(statuses),
        "slowest_paths": [(p, max(by_path[p])) for p in slowest],
    }


if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        report = analyze(f)
    for key, value in report.items():
        print(f"{key}: {value}")
''',
     "This parses our nginx access logs (with request time in ms as the last field). One malformed line kills "
     "the whole run. Skip bad lines instead and report how many were skipped as `skipped` in the result. Return "
     "the complete updated file.",
     ["Rank slowest_paths by the 95th percentile of request time instead of the maximum (write a small "
      "`percentile(values, q)` helper, nearest-rank method). Return the whole file.",
      "Count 4xx responses as `client_errors` next to `errors`, and rename `errors` to `server_errors` "
      "everywhere. Complete file please.",
      "Add docstrings to every function and return the complete file."]),
]


def code_edit_sessions() -> list[tuple[str, list[str]]]:
    out = []
    for i, (slug, filename, source, ask, later) in enumerate(CODE_FILES, start=1):
        block = f"```python\n# {filename}\n{source}```"
        first = f"{ask}\n\n{block}" if i % 2 else f"{block}\n\n{ask}"
        out.append((f"code_edit-{slug}-01", [first, *later]))
    return out


# ---- extract: one JSON skeleton, many records ---------------------------------------------------

DATE_STYLES = ("{d} {M} {y}", "{y}-{m:02d}-{d:02d}", "{M3} {d}, {y}", "{d:02d}/{m:02d}/{y}", "{d}.{m}.{y}")


def fmt_date(rng: random.Random, day: date, style: str | None = None) -> str:
    style = style or rng.choice(DATE_STYLES)
    return style.format(d=day.day, m=day.month, y=day.year, M=MONTHS[day.month - 1], M3=MONTHS[day.month - 1][:3])


def some_day(rng: random.Random, start: date = date(2025, 1, 6), span: int = 300) -> date:
    return start + timedelta(days=rng.randrange(span))


def rec_signature(rng: random.Random) -> str:
    first, last = person(rng)
    company = rng.choice(COMPANIES)
    city, country = rng.choice(CITIES)
    title = rng.choice(("Procurement Manager", "Senior Account Executive", "Head of Operations", "Lead Data Analyst",
                        "Office Coordinator", "Quality Assurance Engineer", "Marketing Director", "Site Supervisor"))
    email = f"{first[0].lower()}.{last.lower()}@{domain_of(company)}"
    web = "www." + domain_of(company)
    opener = rng.choice((
        "Thanks for the quick turnaround on the draft. My comments are in the shared folder.",
        "Happy to join the call on Thursday, 14:00 works for me.",
        "Attached is the signed NDA. Let me know if you need anything else from our side.",
        "Could you resend the invoice with our VAT number on it?",
        "Great meeting you at the trade fair last week! As promised, our price list is attached.",
        "We received the samples this morning, all in good condition."))
    street = f"{rng.randint(2, 180)} {rng.choice(STREETS)}"
    layout = rng.randrange(3)
    if layout == 0:
        return (f"{opener}\n\nBest,\n{first} {last}\n{title} | {company}\nT {phone(rng)} | M {phone(rng)}\n"
                f"{email}\n{web} | {street}, {city}")
    if layout == 1:
        return (f"{opener}\n\nKind regards\n\n{first.upper()} {last.upper()}\n{title}, {company}\n{street} · {city}, "
                f"{country}\nOffice: {phone(rng)}\nE-mail: {email}")
    return (f"{opener}\n\nCheers,\n{first}\n\n--\n{first} {last}\n{title}\n{company} ({city})\n"
            f"{phone(rng)} · {email}\n"
            "This message may contain confidential information. If you received it by mistake, please delete it.")


INVOICE_ITEMS = (("Consulting, hours", 85, 140), ("Website maintenance, monthly", 180, 420),
                 ("A4 copy paper, box of 5 reams", 21, 29), ("Espresso beans 1 kg", 18, 32),
                 ("Safety boots, pair", 55, 95), ("Cloud backup seats, monthly", 6, 12),
                 ("Catering, per person", 14, 28), ("Forklift rental, per day", 120, 190),
                 ("Translation, per 1,000 words", 90, 130), ("Standing desk frame", 240, 380),
                 ("LED panel 60x60", 34, 58), ("Delivery and installation", 60, 150))


def rec_invoice(rng: random.Random) -> str:
    vendor, customer = rng.sample(COMPANIES, 2)
    issued = some_day(rng)
    due = issued + timedelta(days=rng.choice((14, 30, 45)))
    number = f"INV-{issued.year}-{rng.randint(100, 9999):04d}"
    items = []
    for desc, lo, hi in rng.sample(INVOICE_ITEMS, rng.randint(2, 4)):
        items.append((desc, rng.randint(1, 12), round(rng.uniform(lo, hi), 2)))
    subtotal = round(sum(q * p for _, q, p in items), 2)
    cur = rng.choice(("EUR", "GBP"))
    rate = 20 if cur == "GBP" else rng.choice((19, 21, 23))
    tax = round(subtotal * rate / 100, 2)
    city, _ = rng.choice(CITIES)
    if rng.random() < 0.5:
        lines = "\n".join(f"{q} x {d} @ {money(p)} = {money(q * p)}" for d, q, p in items)
        return (f"{vendor.upper()}\n{rng.randint(1, 99)} {rng.choice(STREETS)}, {city}\n\nINVOICE {number}\n"
                f"Date: {fmt_date(rng, issued)}\nBill to: {customer}\n\n{lines}\n\nSubtotal {money(subtotal)} {cur}\n"
                f"VAT {rate}% {money(tax)} {cur}\nTOTAL DUE {money(subtotal + tax)} {cur}\n"
                f"Please pay by {fmt_date(rng, due)} quoting the invoice number.")
    lines = "\n".join(f"{d}\t{q}\t{money(p)}\t{money(q * p)}" for d, q, p in items)
    return (f"From: {vendor}, {city}\nTo: {customer}\nInvoice no. {number} issued {fmt_date(rng, issued)}, "
            f"payment terms {(due - issued).days} days\n\nDescription\tQty\tUnit price\tAmount\n{lines}\n\n"
            f"Net: {cur} {money(subtotal)} | Tax ({rate}%): {cur} {money(tax)} | Gross: {cur} {money(subtotal + tax)}")


JOBS = (("Backend Engineer (Go)", ["Go", "PostgreSQL", "Kubernetes", "gRPC"]),
        ("Data Analyst", ["SQL", "Python", "Tableau", "A/B testing"]),
        ("Warehouse Shift Lead", ["forklift licence", "team leadership", "SAP WM"]),
        ("Frontend Developer", ["TypeScript", "React", "accessibility", "Playwright"]),
        ("Payroll Specialist", ["payroll tax", "DATEV", "Excel"]),
        ("Site Reliability Engineer", ["Linux", "Terraform", "Prometheus", "on-call"]),
        ("Product Designer", ["Figma", "user research", "design systems"]),
        ("Laboratory Technician", ["HPLC", "GLP", "sample preparation"]))


def rec_job(rng: random.Random) -> str:
    title, skills = pick(rng, JOBS)
    company = rng.choice(COMPANIES)
    city, _ = rng.choice(CITIES)
    policy = rng.choice(("fully remote within the EU", "hybrid, two office days a week", "on site"))
    kind = rng.choice(("Full-time, permanent", "Full-time, 12-month contract", "Part-time (24 h/week)"))
    low = rng.randrange(38, 70) * 1000
    high = low + rng.randrange(6, 20) * 1000
    years = rng.randint(1, 6)
    deadline = fmt_date(rng, some_day(rng, date(2025, 9, 1), 90))
    req = ", ".join(rng.sample(skills, len(skills) - 1 if len(skills) > 3 else len(skills)))
    if rng.random() < 0.5:
        return (f"We're hiring! {company} is looking for a {title} to join our team in {city} ({policy}).\n\n"
                f"What you bring: {years}+ years of relevant experience, solid {req}.\n"
                f"What we offer: {low:,}-{high:,} EUR gross per year, 28 days of holiday, a learning budget.\n"
                f"{kind}. Apply before {deadline} via our careers page.")
    return (f"Position: {title}\nEmployer: {company}\nLocation: {city} - {policy}\nContract: {kind}\n"
            f"Salary range: EUR {low // 1000}k to {high // 1000}k\nRequirements:\n"
            + "".join(f"  * {s}\n" for s in req.split(", "))
            + f"  * at least {years} years in a similar role\nClosing date: {deadline}")


PRODUCTS = (("Trailhead 28 daypack", "Redfern", ["slate", "moss", "rust"], 0.9, "50 x 30 x 18"),
            ("Halden ceramic table lamp", "Sablewood", ["sand", "charcoal"], 2.4, "28 x 28 x 45"),
            ("Nimbus cordless kettle 1.5 l", "Korvo", ["white", "black", "sage"], 1.1, "22 x 16 x 25"),
            ("Aero mesh office chair", "Sablewood", ["grey", "black"], 14.5, "66 x 64 x 118"),
            ("Lumo bike light set", "Brakka", ["black"], 0.15, "6 x 3 x 3"),
            ("Keel 10-inch cast iron skillet", "Forgehouse", ["black", "enamel blue"], 2.7, "43 x 26 x 5"),
            ("Driftwood bamboo bath mat", "Tidewell Home", ["natural"], 1.3, "80 x 50 x 1"),
            ("Pulse wireless earbuds", "Vantor", ["white", "graphite", "coral"], 0.06, "6 x 5 x 3"))


def rec_product(rng: random.Random) -> str:
    name, brand, colors, weight, dims = pick(rng, PRODUCTS)
    price = rng.randint(19, 260) - 0.01
    sku = f"{brand[:3].upper()}-{rng.randint(10000, 99999)}"
    cols = rng.sample(colors, rng.randint(1, len(colors)))
    rating = round(rng.uniform(3.6, 4.9), 1)
    reviews = rng.randint(12, 2400)
    stock = rng.choice(("In stock - ships in 1-2 days", "Only 3 left in stock", "Temporarily out of stock"))
    return (f"{brand} {name}\n★ {rating} ({reviews:,} reviews)\n€{price:.2f}  incl. VAT, free delivery over €50\n"
            f"{stock}\nColour: {' / '.join(cols)}\n\nProduct details\nItem weight: {weight} kg\n"
            f"Dimensions: {dims} cm\nModel number: {sku}\n"
            + rng.choice(("Warranty: 2 years", "Returns: 30 days, free", "Warranty: 3 years on parts")))


TICKETS = (
    ("billing", "I was charged twice for my {plan} subscription this month ({amount} EUR each, on the {d1} and the "
     "{d2}). Please refund the duplicate charge. My account email is {email}."),
    ("shipping", "Order {order} still hasn't arrived. Tracking has said 'in transit' for 9 days. I need the {item} "
     "before the weekend, can you send a replacement or tell me what's going on?"),
    ("technical", "Since the last app update the {item} won't pair over Bluetooth any more. I tried resetting it "
     "twice. Order {order}, bought in {month}. Not urgent but quite annoying."),
    ("account", "I can't log in: the password reset email never arrives (checked spam). This is blocking my whole "
     "team from the {plan} workspace. Please help ASAP!"),
    ("billing", "Hello, could you change the company name on invoice for order {order} to {company}? Our accounts "
     "department cannot book it otherwise. Thank you."),
    ("technical", "The export to CSV on the reports page fails with 'Error 500' for date ranges longer than a month. "
     "We're on the {plan} plan. Happens every time since yesterday."),
)


def rec_ticket(rng: random.Random) -> str:
    first, last = person(rng)
    category, body = pick(rng, TICKETS)
    email = f"{first.lower()}.{last.lower()}@{rng.choice(('mailbox', 'postbox', 'inbox'))}.example"
    fill = dict(plan=rng.choice(("Team", "Business", "Pro")), amount=rng.choice((12, 29, 49, 99)),
                d1=rng.choice(("3rd", "4th", "5th")), d2=rng.choice(("6th", "7th", "9th")), email=email,
                order=f"#{rng.randint(100000, 999999)}", item=rng.choice(("speaker", "thermostat", "headphones",
                                                                           "smart plug")),
                month=rng.choice(MONTHS), company=rng.choice(COMPANIES))
    tid = f"TCK-{rng.randint(20000, 89999)}"
    received = fmt_date(rng, some_day(rng), "{y}-{m:02d}-{d:02d}")
    subject = {"billing": "Billing question", "shipping": "Where is my order?", "technical": "Problem with product",
               "account": "Cannot log in"}[category]
    return (f"Ticket {tid} | received {received} via web form\nFrom: {first} {last} <{email}>\nSubject: {subject}\n\n"
            f"{body.format(**fill)}\n\n{first}")


def rec_lab(rng: random.Random) -> str:
    site = rng.choice(("Well 3, Hollins Farm", "Primary school kitchen tap", "Spring at Carrow Wood",
                       "Tank outlet, Unit 7", "Allotment standpipe B", "Private borehole, Lower Fenby"))
    collected = some_day(rng)
    received = collected + timedelta(days=rng.randint(0, 2))
    ph = round(rng.uniform(6.1, 8.6), 1)
    nitrate = round(rng.uniform(2, 68), 1)
    lead = round(rng.uniform(0.5, 14), 1)
    ecoli = rng.choice((0, 0, 0, 2, 11))
    lab = rng.choice(("Oakridge Lab Services", "Clearwater Testing Ltd", "Fenland Analytical"))
    ok = 6.5 <= ph <= 9.5 and nitrate <= 50 and lead <= 10 and ecoli == 0
    return (f"{lab.upper()} - WATER ANALYSIS REPORT\nSample ID: WS-{rng.randint(1000, 9999)}-{collected.year % 100}\n"
            f"Sampling point: {site}\nCollected: {fmt_date(rng, collected)}   Received: {fmt_date(rng, received)}\n\n"
            f"Parameter          Result    Unit        Limit\npH                 {ph:<9} -           6.5-9.5\n"
            f"Nitrate (NO3)      {nitrate:<9} mg/l        50\nLead (Pb)          {lead:<9} µg/l        10\n"
            f"E. coli            {ecoli:<9} cfu/100ml   0\n\n"
            + ("Comment: all parameters within limits." if ok else "Comment: one or more parameters exceed the limit."
               " Resample advised."))


def rec_shipping(rng: random.Random) -> str:
    first, last = person(rng)
    city, _ = rng.choice(CITIES)
    carrier = rng.choice(("ParcelLine", "SwiftPost", "Norda Freight", "CityHop Couriers"))
    shipped = some_day(rng)
    eta = shipped + timedelta(days=rng.randint(1, 6))
    n = rng.randint(1, 4)
    weight = round(rng.uniform(0.4, 9.5) * n, 1)
    track = f"{carrier[:2].upper()}{rng.randint(10**9, 10**10 - 1)}"
    order = f"{rng.randint(100, 999)}-{rng.randint(1000000, 9999999)}"
    sig = rng.random() < 0.4
    return (f"Good news, {first}! Your order {order} is on its way.\n\nShipped on {fmt_date(rng, shipped)} with "
            f"{carrier}, {n} package{'s' if n > 1 else ''} ({weight} kg in total).\nTracking number: {track}\n"
            f"Estimated delivery: {fmt_date(rng, eta)}\nDelivering to: {first} {last}, {rng.randint(1, 90)} "
            f"{rng.choice(STREETS)}, {city}\n"
            + ("A signature will be required on delivery." if sig else "The driver may leave it in a safe place."))


def rec_property(rng: random.Random) -> str:
    city, _ = rng.choice(CITIES)
    hood = rng.choice(("Old Town", "Riverside", "University quarter", "Harbour district", "North Park"))
    beds = rng.randint(1, 4)
    baths = 1 if beds < 3 else rng.randint(1, 2)
    area = beds * rng.randint(22, 30) + rng.randint(10, 25)
    rent = area * rng.randint(11, 21) // 25 * 25
    avail = fmt_date(rng, some_day(rng, date(2025, 8, 1), 120))
    furnished = rng.random() < 0.5
    pets = rng.choice(("Pets welcome", "Sorry, no pets", "Small pets on request"))
    kind = rng.choice(("flat", "apartment") if beds < 3 else ("flat", "terraced house", "maisonette"))
    feature = rng.choice(("Balcony facing the courtyard", "Lift and bike storage", "Ten minutes to the tram",
                          "Newly renovated kitchen"))
    return (f"Bright {beds}-bedroom {kind} in {hood}, {city}\n{area} m² · {beds} bed · {baths} bath · "
            f"{'furnished' if furnished else 'unfurnished'}\n€{rent:,}/month + utilities, "
            f"deposit {rng.choice((2, 3))} "
            f"months' rent\nAvailable from {avail}\n{pets}. {feature}.\nViewings: call {phone(rng)}")


def rec_hotel(rng: random.Random) -> str:
    first, last = person(rng)
    city, _ = rng.choice(CITIES)
    hotel = f"{rng.choice(('Hotel', 'The'))} {rng.choice(('Lantern', 'Quayside', 'Linden', 'Meridian', 'Old Mill'))} " \
            f"{rng.choice(('House', 'Inn', 'Suites', city))}"
    arrive = some_day(rng)
    nights = rng.randint(1, 5)
    rate = rng.randint(70, 240)
    room = rng.choice(("Standard double", "Superior twin", "Junior suite", "Single room, courtyard view"))
    guests = 1 if room.startswith("Single") else rng.randint(1, 2)
    breakfast = rng.random() < 0.5
    cancel = arrive - timedelta(days=rng.choice((1, 2, 7)))
    return (f"Dear {first} {last},\n\nthank you for booking with {hotel}, {city}. Confirmation number: "
            f"{rng.randint(10**7, 10**8 - 1)}\n\nCheck-in: {fmt_date(rng, arrive)} from 15:00\nCheck-out: "
            f"{fmt_date(rng, arrive + timedelta(days=nights))} until 11:00\n"
            f"Room: {room}, {guests} guest{'s' if guests > 1 else ''}\n"
            f"Rate: EUR {rate}.00 per night ({'breakfast included' if breakfast else 'room only'})\nTotal: EUR "
            f"{rate * nights}.00\n\nFree cancellation until {fmt_date(rng, cancel)}, 18:00 local time.")


CARS = (("Skoda", "Octavia Combi", "diesel", 85), ("Toyota", "Yaris Hybrid", "hybrid", 85),
        ("Volkswagen", "Golf", "petrol", 110), ("Renault", "Zoe", "electric", 80), ("Volvo", "V60", "diesel", 140),
        ("Mazda", "CX-5", "petrol", 121), ("Kia", "Niro EV", "electric", 150), ("Ford", "Focus", "petrol", 92))


def rec_car(rng: random.Random) -> str:
    make, model, fuel, kw = pick(rng, CARS)
    year = rng.randint(2013, 2023)
    km = (2025 - year) * rng.randint(9, 19) * 1000 + rng.randint(0, 999)
    price = max(3900, (year - 2010) * rng.randint(1500, 2100) - km // 20) // 50 * 50
    gearbox = "automatic" if fuel in ("electric", "hybrid") else rng.choice(("manual", "automatic"))
    owners = rng.randint(1, 3)
    city, _ = rng.choice(CITIES)
    if rng.random() < 0.5:
        return (f"{make} {model} {year}, {km:,} km, {fuel}, {gearbox}, {kw} kW. {owners} owner"
                f"{'s' if owners > 1 else ''}, full service history, new tyres last winter. "
                "Private sale, no trade-ins. "
                f"Asking €{price:,}, small discount for a quick sale. Viewing in {city} evenings and weekends.")
    return (f"{make.upper()} {model.upper()}\nFirst registration: {rng.randint(1, 12):02d}/{year}\nMileage: {km:,} km\n"
            f"Fuel: {fuel.capitalize()} | Gearbox: {gearbox.capitalize()} | Power: {kw} kW ({round(kw * 1.36)} hp)\n"
            f"Previous owners: {owners}\nPrice: {price:,} EUR (VAT deductible)\nDealer: "
            f"{rng.choice(('Autohaus Lindner', 'Motorhall ' + city, 'Greenway Cars'))}, {city}")


BUGS = (("Checkout button stays disabled after applying a coupon", "checkout",
         ["Add any item to the cart", "Open the cart and apply coupon WELCOME10", "Fill in the address form"],
         "The 'Pay now' button becomes enabled", "It stays greyed out until the page is reloaded"),
        ("Dark mode resets after restart", "settings",
         ["Open Settings > Appearance", "Switch Theme to Dark", "Quit and reopen the app"],
         "The app opens in dark mode", "The app opens in light mode again"),
        ("Crash when importing a CSV with an empty last line", "import",
         ["Go to Contacts > Import", "Choose a CSV file that ends with an empty line", "Press Import"],
         "The contacts are imported", "The app closes without an error message"),
        ("Search returns no results for words with accents", "search",
         ["Create a note titled 'Café menu'", "Search for 'cafe'"], "The note is found",
         "No results; searching 'Café' with the accent works"),
        ("Notification badge count never clears", "notifications",
         ["Receive two direct messages", "Read both messages on the desktop app", "Open the mobile app"],
         "The badge shows 0", "The badge still shows 2"))


def rec_bug(rng: random.Random) -> str:
    title, comp, steps, expected, actual = pick(rng, BUGS)
    first, last = person(rng)
    version = f"{rng.randint(2, 5)}.{rng.randint(0, 14)}.{rng.randint(0, 9)}"
    platform = rng.choice(("Android 14, Pixel 7", "iOS 18.1, iPhone 13", "Windows 11, Chrome 129",
                           "macOS 14.6, Safari", "Ubuntu 24.04, Firefox 131"))
    sev = rng.choice(("minor", "major", "critical"))
    numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(steps, start=1))
    return (f"[{comp}] {title}\nReported by {first} {last} · severity: {sev}\nVersion {version} on {platform}\n\n"
            f"Steps:\n{numbered}\n\nExpected: {expected}.\nActual: {actual}.")


GROCERIES = (("Oat milk 1l", 1.89), ("Sourdough loaf", 3.40), ("Free-range eggs x10", 3.99), ("Bananas 1kg", 1.29),
             ("Cheddar 400g", 4.75), ("Coffee beans 500g", 8.90), ("Tomatoes on the vine", 2.35),
             ("Dish soap", 2.10), ("Basmati rice 1kg", 2.69), ("Greek yoghurt 500g", 2.49), ("Olive oil 750ml", 7.80))


def rec_receipt(rng: random.Random) -> str:
    store = rng.choice(("GREENBASKET MARKET", "CORNER FRESH #214", "HARVEST & CO", "DAILY LARDER"))
    city, _ = rng.choice(CITIES)
    day = some_day(rng)
    items = [(n, rng.randint(1, 3), p) for n, p in rng.sample(GROCERIES, rng.randint(3, 6))]
    total = round(sum(q * p for _, q, p in items), 2)
    rate = rng.choice((7, 9, 10))
    tax = round(total * rate / (100 + rate), 2)
    pay = rng.choice(("VISA", "MASTERCARD", "CASH", "DEBIT"))
    lines = "\n".join(f"{n.upper():<24}{q} x {p:.2f}  {q * p:>6.2f}" for n, q, p in items)
    tail = (f"CASH TENDERED {math.ceil(total / 10) * 10:.2f}" if pay == "CASH"
            else f"{pay} **** {rng.randint(1000, 9999)}  APPROVED")
    return (f"{store}\n{rng.randint(1, 99)} {rng.choice(STREETS)}, {city}\n{fmt_date(rng, day, '{d:02d}/{m:02d}/{y}')} "
            f"{rng.randint(8, 20):02d}:{rng.randint(0, 59):02d}\n\n{lines}\n\nTOTAL {total:.2f}\nincl. VAT {rate}% "
            f"{tax:.2f}\n{tail}\nTHANK YOU FOR SHOPPING WITH US")


EVENTS = (("Open Source Day: contributing to your first project", "workshop", (10, 13), "Please bring a laptop."),
          ("Urban Beekeeping for Beginners", "talk", (18, 19), "Honey tasting afterwards."),
          ("Night of Short Films", "screening", (19, 20), "Films in the original language with subtitles."),
          ("Repair Café: bring your broken toaster", "meetup", (10, 14), "Volunteer fixers for small appliances."),
          ("Intro to Watercolour Landscapes", "workshop", (9, 14), "All materials provided."),
          ("Local Climate Action Forum", "panel", (18, 19), "Step-free access."),
          ("Board Game Marathon", "meetup", (12, 15), "Drinks and snacks provided."))


def rec_event(rng: random.Random) -> str:
    name, kind, starts, note = pick(rng, EVENTS)
    city, _ = rng.choice(CITIES)
    org = rng.choice(COMPANIES + ("City Library Friends", "Makerspace Collective", "Riverside Residents' Association"))
    day = some_day(rng, date(2025, 9, 1), 120)
    start = rng.randint(*starts)
    length = rng.randint(1, 3)
    price = rng.choice((0, 0, 5, 12, 25))
    cap = rng.choice((20, 30, 45, 80, 150))
    venue = rng.choice(("Community Hall", "Central Library, room 2", "The Old Tram Depot", "Canal Street Studios"))
    slug = "-".join("".join(c for c in w if c.isascii() and c.isalnum()) for w in name.lower().split()[:4])
    price_text = "Free entry" if price == 0 else f"Tickets €{price}"
    return (f"{name}\n{kind.capitalize()} hosted by {org}\n\n{fmt_date(rng, day)}, {start}:00-{start + length}:00\n"
            f"{venue}, {city}\n{price_text} · limited to {cap} places\n"
            f"Register at https://events.example/{slug}\n\n{note}")


COURSES = (("CS", "Databases", ["CS 120"]), ("MATH", "Linear Algebra II", ["MATH 110"]),
           ("BIO", "Microbial Ecology", ["BIO 101", "CHEM 105"]), ("ECON", "Behavioural Economics", ["ECON 100"]),
           ("HIST", "Cities of the Medieval Mediterranean", []), ("PHYS", "Thermodynamics", ["PHYS 130", "MATH 115"]),
           ("LING", "Introduction to Phonetics", []), ("ENV", "Water Resource Management", ["ENV 110"]))


def rec_course(rng: random.Random) -> str:
    dept, title, prereq = pick(rng, COURSES)
    code = f"{dept} {rng.randint(2, 4)}{rng.randint(0, 9)}{rng.randint(0, 9)}"
    first, last = person(rng)
    days = rng.choice((("Mon", "Wed"), ("Tue", "Thu"), ("Fri",), ("Mon", "Wed", "Fri")))
    start = rng.choice((8, 9, 10, 13, 14, 16))
    mins = 50 if len(days) == 3 else rng.choice((75, 90))
    end_m = start * 60 + rng.choice((0, 30)) + mins
    start_text = f"{start}:{(end_m - mins) % 60:02d}"
    credits = rng.choice((3, 4, 5, 6))
    building = rng.choice(("Hartley", "Ostrom", "Keane", "Baxter"))
    room = f"{building} {rng.randint(1, 3)}{rng.randint(0, 2)}{rng.randint(1, 9)}"
    pre = ", ".join(prereq) if prereq else "none"
    term = rng.choice(("Autumn 2025", "Spring 2026"))
    return (f"{code} - {title} ({credits} ECTS)\n{term} · Instructor: Dr. {first[0]}. {last}\n"
            f"{'/'.join(days)} {start_text}-{end_m // 60}:{end_m % 60:02d}, {room}\nPrerequisites: {pre}\n"
            f"Enrolment cap: {rng.choice((24, 40, 60, 120))} students\n"
            + rng.choice(("Assessment: project (40%), final exam (60%).", "Weekly problem sets; no final exam.",
                          "Includes two field trips.", "Taught in English.")))


# (slug, record function, request, fields). Fields are written as "name: what it holds".
EXTRACT_KINDS = [
    ("signature", rec_signature,
     "I'm cleaning up our CRM. Extract the sender's contact details from the end of this email.",
     ["full_name: string", "job_title: string", "company: string", "email: string",
      "phone: string, the first number given", "city: string", "website: string or null"]),
    ("invoice", rec_invoice, "Extract the invoice data so our bookkeeping script can import it.",
     ["invoice_number: string", "issue_date: YYYY-MM-DD", "due_date: YYYY-MM-DD or null", "vendor: string",
      "customer: string", "line_items: list of {description, quantity, unit_price}", "subtotal: number",
      "tax_rate_percent: number", "total: number", "currency: ISO code"]),
    ("job_posting", rec_job, "We track job ads in a spreadsheet. Pull these fields out of the posting.",
     ["job_title: string", "company: string", "city: string", "work_mode: onsite, hybrid or remote",
      "employment_type: full-time or part-time", "contract: permanent or fixed-term", "salary_min: integer",
      "salary_max: integer", "currency: ISO code", "min_years_experience: integer", "skills: list of strings",
      "apply_by: YYYY-MM-DD"]),
    ("product", rec_product, "Turn this product listing into a catalogue record.",
     ["name: string, without the brand", "brand: string", "price: number", "currency: ISO code", "sku: string",
      "colors: list of strings", "weight_kg: number", "dimensions_cm: string like 'L x W x H'",
      "in_stock: boolean", "rating: number", "review_count: integer"]),
    ("ticket", rec_ticket, "Triage this support ticket into our helpdesk format.",
     ["ticket_id: string", "customer_name: string", "customer_email: string",
      "category: billing, shipping, technical or account", "priority: low, normal, high or urgent (your judgement)",
      "order_number: string or null", "summary: one sentence", "requested_action: string"]),
    ("lab_report", rec_lab, "Extract the water test results for our sampling database.",
     ["sample_id: string", "site: string", "collected_on: YYYY-MM-DD", "received_on: YYYY-MM-DD", "lab: string",
      "ph: number", "nitrate_mg_l: number", "lead_ug_l: number", "e_coli_cfu_100ml: integer",
      "within_limits: boolean"]),
    ("shipping", rec_shipping, "Extract the shipment details from this notification email.",
     ["carrier: string", "tracking_number: string", "order_number: string", "shipped_on: YYYY-MM-DD",
      "estimated_delivery: YYYY-MM-DD", "recipient: string", "city: string", "packages: integer",
      "total_weight_kg: number", "signature_required: boolean"]),
    ("property", rec_property, "I'm comparing rental listings. Extract this one.",
     ["property_type: string", "bedrooms: integer", "bathrooms: integer", "area_m2: integer",
      "rent_per_month: integer", "currency: ISO code", "deposit_months: integer", "city: string",
      "neighbourhood: string", "available_from: YYYY-MM-DD", "furnished: boolean",
      "pets: allowed, not_allowed or on_request"]),
    ("hotel", rec_hotel, "Extract the booking from this hotel confirmation for my travel expense report.",
     ["hotel_name: string", "city: string", "confirmation_number: string", "guest_name: string",
      "check_in: YYYY-MM-DD", "check_out: YYYY-MM-DD", "nights: integer", "room_type: string", "guests: integer",
      "total_price: number", "currency: ISO code", "breakfast_included: boolean",
      "free_cancellation_until: YYYY-MM-DD"]),
    ("used_car", rec_car, "Extract the key facts of this used-car ad.",
     ["make: string", "model: string", "year: integer", "mileage_km: integer",
      "fuel: petrol, diesel, hybrid or electric", "transmission: manual or automatic", "power_kw: integer",
      "price: integer", "currency: ISO code", "previous_owners: integer", "seller: private or dealer"]),
    ("bug_report", rec_bug, "Convert this bug report into a JSON issue for our tracker.",
     ["title: string", "component: string", "severity: minor, major or critical", "app_version: string",
      "platform: string", "steps: list of strings", "expected: string", "actual: string", "reporter: string"]),
    ("receipt", rec_receipt, "Extract this shopping receipt for my budgeting app.",
     ["store: string", "date: YYYY-MM-DD", "time: HH:MM", "items: list of {name, quantity, unit_price}",
      "total: number", "vat_rate_percent: number", "vat_amount: number", "payment_method: cash or card",
      "card_last4: string or null"]),
    ("event", rec_event, "Add this event to our community calendar feed; extract it as JSON.",
     ["title: string", "format: string", "organizer: string", "date: YYYY-MM-DD", "start_time: HH:MM",
      "end_time: HH:MM", "venue: string", "city: string", "price_eur: number, 0 if free", "capacity: integer",
      "registration_url: string"]),
    ("course", rec_course, "I'm building a timetable app. Extract this course catalogue entry.",
     ["course_code: string", "title: string", "credits_ects: integer", "term: string", "instructor: string",
      "days: list of strings", "start_time: HH:MM", "end_time: HH:MM", "room: string",
      "prerequisites: list of course codes", "enrolment_cap: integer"]),
]

SAME = ("Same for this one:", "Same for this one:", "Same for this one:", "Same fields for this one:", "And this one:")


def extract_sessions() -> list[tuple[str, list[str]]]:
    out = []
    for slug, make, request, fields in EXTRACT_KINDS:
        session = f"extract-{slug}-01"
        rng = rng_for(session)
        field_lines = "\n".join(f"- {f}" for f in fields)
        first = (f"{request} Reply with only a JSON object with exactly these fields (null when the text does not "
                 f"say):\n{field_lines}\n\n{make(rng)}")
        turns = [first] + [f"{rng.choice(SAME)}\n\n{make(rng)}" for _ in range(rng.randint(3, 4))]
        out.append((session, turns))
    return out


# ---- rewrite: later turns reuse the previous answer ---------------------------------------------

FORMAL = "Rewrite your answer in a more formal tone, keeping every detail."
SHORTER = "Now make it half as long without losing any of the facts."
BULLETS = "Turn it into a bulleted list."
FRIENDLIER = "Rewrite it in a warmer, friendlier tone. Keep all the details."

REWRITES = [
    ("landlord", "Write an email to my landlord, Mr. Petrakis, about the heating in my flat (4B, 17 Canal Walk). "
     "Facts: the radiators in the living room and bedroom have been cold since Monday 6 October; the boiler shows "
     "error code F28; I reported it by phone on Tuesday and was told a technician would come on Wednesday, but "
     "nobody came; indoor temperature is 15 °C at night; I work from home. I'd like a technician to come by Friday "
     "and I'm home every day after 8:00. My name is Camille Szabo.",
     [FORMAL, SHORTER, "Translate the email into German."]),
    ("office_move", "Write an announcement to all staff of Brightwater Logistics about our office move. Facts: we "
     "move from 12 Station Road to the 3rd floor of the Foundry Yard building (Foundry Yard 4) on Monday 3 "
     "November; the old office closes Friday 31 October at 13:00; everyone packs their desk into the labelled "
     "crates by Thursday 30 October; IT moves the computers over the weekend; the new office has 40 bike spaces "
     "but only 6 car spaces, reserved for people with mobility needs; questions go to Greta Dunmore in facilities.",
     [BULLETS, "Now write it as a short Slack message of at most 4 sentences.", FRIENDLIER,
      "Translate the original announcement into Spanish."]),
    ("product", "Write a product description for our online shop. Product: the Ferngrove insulated bottle, 750 ml, "
     "double-wall stainless steel, keeps drinks cold for 24 hours and hot for 12, leak-proof lid with a carry "
     "loop, fits standard car cup holders, dishwasher safe except for the lid, colours: fjord blue, moss and "
     "sandstone, price 29 EUR, 5-year warranty, 10% of each sale goes to river clean-up projects. Around 120 words.",
     ["Rewrite it for a younger audience, more playful, same facts.", SHORTER, BULLETS]),
    ("meeting_notes", "Turn these notes into a meeting summary email to the team.\n\nNotes, website relaunch sync, "
     "Tue 14 Oct, present: Amara, Hugo, Wen, Joaquin\n- launch date moves 3 Nov -> 17 Nov, translations late\n- Wen: "
     "French + Italian copy by 31 Oct\n- Hugo: fix mobile nav bug (menu overlaps logo) this week\n- cookie banner "
     "needs legal sign-off, Amara asks legal by Fri\n- budget ok, 2k left for stock photos\n- Joaquin: load test "
     "on staging week of 3 Nov\n- next sync 21 Oct same time",
     [SHORTER, "Rewrite it as a table of action items with owner and deadline, followed by two sentences on the "
      "decisions.", FORMAL, "Translate the summary into French."]),
    ("cover_letter", "Write a cover letter for me. Job: junior data analyst at Kestrel Analytics in Rotterdam "
     "(reference KA-2291). Facts about me: Valentina Coutinho; MSc in economics from Porto, graduated July 2025; "
     "thesis on bike-sharing demand with Python and SQL; 6-month internship at a logistics firm where I built a "
     "Power BI dashboard that cut weekly reporting time from 5 hours to 1; Portuguese native, fluent English, "
     "basic Dutch; can start 1 December. Keep it under 300 words.",
     [FORMAL, "Make it more concise, about 180 words, keeping the internship numbers.",
      "Rewrite the opening paragraph so that it starts with the internship result, and return the whole letter."]),
    ("outage", "Write an email to our customers apologising for yesterday's outage. Facts: Lumen Harbor's invoicing "
     "app was unavailable on 8 October from 09:12 to 11:47 CET; cause: a database migration locked the invoices "
     "table; no data was lost; invoices scheduled in that window were sent at 12:05; we are adding a staging "
     "check that runs every migration against a copy of production data; every affected customer gets a 20% "
     "credit on their next monthly bill automatically; contact support@lumenharbor.example with questions.",
     [SHORTER, FORMAL, "Write a version for our status page: neutral, factual, in past tense, no marketing.",
      "Translate the customer email into Italian."]),
    ("cleanup", "Write an invitation for our neighbourhood clean-up day. Facts: Saturday 18 October, 10:00 to "
     "13:00, meeting point the playground on Mill Lane; we provide gloves, bags and litter pickers; bring sturdy "
     "shoes; children welcome with an adult; soup and bread afterwards at the community hall, vegan option "
     "available; organised by the Riverside Residents' Association; sign up with Rosa on 07700 900142 so we know "
     "how much soup to make.",
     ["Make it shorter, like a poster: a headline and at most 5 lines.", FRIENDLIER, BULLETS]),
    ("status_update", "Write a quarterly status update for the steering committee on the warehouse scanner "
     "rollout. Facts: 9 of 12 sites live (target was 10); pick errors at live sites down from 2.1% to 0.6%; "
     "sites Gdańsk, Brno and Cork delayed because the Wi-Fi survey found dead zones; access points ordered, "
     "arriving week 45; budget 412k EUR spent of 520k; risk: scanner battery life in cold stores is 5 hours "
     "instead of 8, vendor is testing a new battery; next milestone all 12 sites live by 15 December.",
     [BULLETS, "Now make it half as long, for an executive who reads only the first screen.", FORMAL,
      "Translate the original update into German."]),
    ("expense_policy", "Write an internal announcement about changes to our travel expense policy, starting 1 "
     "November. Facts: hotel limit rises from 130 to 160 EUR per night in capital cities, stays at 130 elsewhere; "
     "train is required for trips under 4 hours; meals are reimbursed as a daily allowance of 45 EUR instead of "
     "receipts; receipts must be uploaded in the Spendly app within 30 days; trips booked before 1 November "
     "follow the old rules; questions to finance@ironbark.example.",
     [BULLETS, "Rewrite it as an FAQ with 5 questions and answers.", SHORTER]),
    ("welcome", "Write a welcome email to a new hire, Noor Rasmussen, who joins our support team on Monday 10 "
     "November. Facts: arrive at 9:30 at reception, 5th floor, ask for Felix Ibarra (team lead); laptop and badge "
     "are ready; first week: product training Mon-Wed, shadowing calls Thu-Fri; lunch with the team on Monday, "
     "our treat; bring an ID document for the contract; dress code is casual.",
     [FORMAL, "Make it shorter, like a text message.", BULLETS, "Translate the email into Spanish."]),
    ("farewell", "Write a farewell message to my colleagues. Facts: I'm Bruno Achterberg, leaving Halcyon "
     "Robotics after 7 years on the firmware team; last day is Friday 24 October; I'm moving to Aarhus to join a "
     "wind-energy start-up; highlights: the night we got the first gripper prototype to pick an egg, the 2023 "
     "hackathon win; thank Leona for mentoring me when I started; drinks at the Copper Kettle on my last day "
     "from 17:00; personal email bruno.a@mailbox.example.",
     [SHORTER, FORMAL, "Rewrite it as a LinkedIn post, first person, no personal email address."]),
    ("volunteers", "Write a call for volunteers for the library's summer reading programme for children aged 6 "
     "to 11. Facts: 8 weeks from 1 July; volunteers read with small groups for 2 hours a week, weekday "
     "mornings; no experience needed, a 1-hour training on 21 June; volunteers need a background check, which "
     "the library arranges and pays for; last year 140 children took part and 22 volunteers helped; apply at "
     "the front desk or by email to reading@citylibrary.example by 1 June.",
     [FRIENDLIER, BULLETS, "Now write a version of 2 sentences for the library's Instagram caption.",
      "Translate the call into French."]),
    ("release_notes", "Write user-facing release notes for version 4.2 of our note-taking app, Quillnote. "
     "Changes: offline mode for Android (notes sync when you reconnect); search now ignores accents, so 'cafe' "
     "finds 'Café'; export to PDF keeps checkbox states; fixed: dark mode resetting after restart; fixed: crash "
     "when importing a CSV that ends with an empty line; the Windows 10 32-bit version is no longer supported "
     "from this release.",
     ["Rewrite it as a short blog post with an intro paragraph.", BULLETS, SHORTER]),
    ("baggage", "Write a complaint to the airline about my delayed baggage. Facts: flight NL1726 Lisbon to "
     "Copenhagen on 14 October; my suitcase (dark green, hard shell, tag NL 481 223) did not arrive; I filed "
     "report CPHNL40981 at the airport; it was delivered to my hotel 3 days later; in the meantime I spent 186 "
     "EUR on clothes and toiletries, receipts attached; I ask for reimbursement of the 186 EUR within 30 days. "
     "Name: Ingrid Halvorsen.",
     [FORMAL, SHORTER, "Rewrite it as a short message for the airline's online contact form, max 600 "
      "characters."]),
]


def rewrite_sessions() -> list[tuple[str, list[str]]]:
    out = []
    for slug, first, later in REWRITES:
        assert sum("Translate" in t for t in later) <= 1, slug
        out.append((f"rewrite-{slug}-01", [first, *later]))
    return out


# ---- assembly ------------------------------------------------------------------------------------

def sessions() -> list[dict]:
    """All sessions, round-robin over the categories, with ids from 1."""
    by_cat = {"agent": agent_sessions(), "code_edit": code_edit_sessions(), "extract": extract_sessions(),
              "rewrite": rewrite_sessions()}
    rows = []
    for i in range(max(len(v) for v in by_cat.values())):
        for cat in CATEGORY_ORDER:
            if i < len(by_cat[cat]):
                session, turns = by_cat[cat][i]
                rows.append({"question_id": len(rows) + 1, "category": cat, "turns": turns, "session": session})
    for row in rows:
        for t in row["turns"]:
            if len(t) > MAX_TURN_CHARS:
                raise SystemExit(f"{row['session']}: a turn has {len(t)} characters (max {MAX_TURN_CHARS})")
        total = sum(map(len, row["turns"]))
        if total > MAX_SESSION_CHARS:
            raise SystemExit(f"{row['session']}: {total} characters in all turns (max {MAX_SESSION_CHARS})")
    return rows


def render() -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in sessions())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the file differs from what would be written")
    parser.add_argument("--output", type=Path, default=OUT, help=f"where to write (default {OUT})")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not args.output.is_file():
            print(f"{args.output}: missing; run scripts/make_agentic.py", file=sys.stderr)
            return 1
        if args.output.read_text(encoding="utf-8") != text:
            print(f"{args.output}: out of date; run scripts/make_agentic.py", file=sys.stderr)
            return 1
        print(f"{args.output}: up to date")
        return 0
    if not args.output.parent.is_dir():
        parser.error(f"--output: directory {args.output.parent} does not exist")
    args.output.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {len(text.splitlines())} sessions to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
