"""Shared fixtures: the real packaged MiniLM and a small hand-written tool catalogue."""

from __future__ import annotations

import pytest

from slb.embedder import Embedder

# Hand-written tools (not from any dataset): distinct enough that the embedding alone routes them.
TOOLS = [
    {"name": "get_weather", "description": "Get the current weather forecast for a city.",
     "inputSchema": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
                     "required": ["city"]}},
    {"name": "send_email", "description": "Send an email message to a recipient with a subject and body.",
     "inputSchema": {"type": "object", "properties": {"to": {"type": "string"}, "subject": {"type": "string"},
                                                      "body": {"type": "string"}}}},
    {"name": "calc.triangle_area", "description": "Calculate the area of a triangle from its base and height.",
     "inputSchema": {"type": "object", "properties": {"base": {"type": "number"}, "height": {"type": "number"}}}},
    {"name": "stock_price", "description": "Look up the latest trading price of a stock ticker symbol.",
     "inputSchema": {"type": "object", "properties": {"ticker": {"type": "string"}}}},
    {"name": "translate_text", "description": "Translate text from one language into another language.",
     "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}, "target_lang": {"type": "string"}}}},
    {"name": "book_flight", "description": "Book an airline flight between two airports on a date.",
     "inputSchema": {"type": "object", "properties": {"origin": {"type": "string"}, "destination": {"type": "string"},
                                                      "date": {"type": "string"}}}},
    {"name": "play_music", "description": "Play a song or playlist by an artist on the speaker.",
     "inputSchema": {"type": "object", "properties": {"song": {"type": "string"}, "artist": {"type": "string"}}}},
    {"name": "set_timer", "description": "Start a countdown timer for a number of minutes.",
     "inputSchema": {"type": "object", "properties": {"minutes": {"type": "integer"}}}},
    {"name": "search_recipes", "description": "Find cooking recipes that use the given ingredients.",
     "inputSchema": {"type": "object", "properties": {"ingredients": {"type": "array"}}}},
    {"name": "convert_currency",
     "description": "Convert an amount of money from one currency to another at today's rate.",
     "inputSchema": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                                      "to": {"type": "string"}}}},
    {"name": "create_calendar_event",
     "description": "Create a meeting on the calendar with attendees and a start time.",
     "inputSchema": {"type": "object", "properties": {"title": {"type": "string"}, "start": {"type": "string"},
                                                      "attendees": {"type": "array"}}}},
    {"name": "git_commit", "description": "Commit staged changes in a git repository with a message.",
     "inputSchema": {"type": "object", "properties": {"message": {"type": "string"}, "repo": {"type": "string"}}}},
]

QUERIES = [
    ("Will it rain in Paris today?", "get_weather"),
    ("Email my boss that I'll be late, subject: delay", "send_email"),
    ("What is the area of a triangle with base 4 and height 3?", "calc.triangle_area"),
    ("How much is AAPL trading at right now?", "stock_price"),
    ("Say 'good morning' in Japanese", "translate_text"),
    ("I need a plane ticket from Boston to Denver next Friday", "book_flight"),
    ("Put on some Beatles songs", "play_music"),
    ("Remind me in 10 minutes, start a countdown", "set_timer"),
    ("What can I cook with eggs, spinach and cheese?", "search_recipes"),
    ("How many euros is 250 dollars?", "convert_currency"),
    ("Schedule a meeting with Ana and Li tomorrow at 3pm", "create_calendar_event"),
    ("Commit my changes with message 'fix typo'", "git_commit"),
]


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return Embedder()
