"""The numbered text menus open per session (a reply with more choices than WhatsApp's buttons
shows them as a numbered list; a later "2" or a typed title picks one).

The store holds them, so they survive a restart and every replica sees them. Most sessions
never have one, so when this process is the store's only writer (no replicas to hear from:
SQLite) it also keeps the set of sessions with an open menu, and an inbound text or a reply in
any other session costs no store read.
"""

from __future__ import annotations

from channels.whatsapp.outbound import Menu, menu_from_json, menu_to_json
from core.policies import NotifyingStore
from core.store import Store

__all__ = ["NS_MENU", "Menus"]

NS_MENU = "whatsapp.menu"  # session → the numbered text menu last sent ("" once it is over)


class Menus:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._open: set[str] | None = None  # None: others write too, always ask the store

    async def start(self) -> None:
        if isinstance(self._store, NotifyingStore):
            return
        items = await self._store.kv_items(NS_MENU)
        self._open = {session for session, text in items.items() if menu_from_json(text)}

    async def get(self, session: str) -> Menu:
        if self._open is not None and session not in self._open:
            return []
        return menu_from_json(await self._store.kv_get(NS_MENU, session))

    async def show(self, session: str, menu: Menu) -> None:
        """`menu` is the one the person now sees (empty: none, any earlier one is over)."""
        if menu:
            await self._store.kv_set(NS_MENU, session, menu_to_json(menu))
            if self._open is not None:
                self._open.add(session)
        elif await self.get(session):
            await self._store.kv_set(NS_MENU, session, "")
            if self._open is not None:
                self._open.discard(session)
