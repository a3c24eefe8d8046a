"""The numbered text menus open per session (a reply with more choices than WhatsApp's buttons
shows them as a numbered list; a later "2" or a typed title picks one).

The store holds them, so they survive a restart and every replica sees them. Most sessions
never have one, so this process also remembers, for recent sessions, what the store holds, and
a text or a reply in such a session costs no store read (the first look at a session reads
it). Every change is announced and the store tells of each (SQLite: this process is its only
writer; PostgreSQL: NOTIFY to every replica), which forgets that session's entry, and while
such news could be missed (PostgreSQL's LISTEN connection is down) nothing is remembered.
"""

from __future__ import annotations

from cachetools import LRUCache

from channels.whatsapp.outbound import Menu, menu_from_json, menu_to_json
from core.policies import KvWatchingStore
from core.store import Store

__all__ = ["KNOWN_MAX", "NS_MENU", "Menus"]

NS_MENU = "whatsapp.menu"  # session → the numbered text menu last sent ("" once it is over)
KNOWN_MAX = 4096  # sessions whose menu (or its absence) is remembered here


class Menus:
    def __init__(self, store: Store) -> None:
        self._store = store
        self._watch = store if isinstance(store, KvWatchingStore) else None
        # session → its menu as the store has it; None: changes go unannounced, ask the store
        self._known: LRUCache[str, Menu] | None = LRUCache(KNOWN_MAX) if self._watch else None
        self._changes = 0  # counts changes: a store read that overlapped one is not remembered

    async def start(self) -> None:
        """Hear of every menu shown or ended, by this process or another replica."""
        if self._watch is not None:
            await self._watch.watch_kv(NS_MENU, self._changed)

    async def get(self, session: str) -> Menu:
        known = self._known if self._watching() else None
        if known is not None and session in known:
            return known[session]
        changes = self._changes
        menu = menu_from_json(await self._store.kv_get(NS_MENU, session))
        if changes == self._changes:
            self._remember(session, menu)
        return menu

    def _watching(self) -> bool:
        return self._watch is not None and self._watch.kv_watched()

    def _changed(self, session: str | None) -> None:
        self._changes += 1
        if self._known is None:
            return
        if session is None:
            self._known.clear()
        else:
            self._known.pop(session, None)

    async def show(self, session: str, menu: Menu) -> None:
        """`menu` is the one the person now sees (empty: none, any earlier one is over)."""
        if menu:
            await self._store.kv_set(NS_MENU, session, menu_to_json(menu), announce=True)
        elif await self.get(session):
            await self._store.kv_set(NS_MENU, session, "", announce=True)
        else:
            return
        self._changes += 1
        self._remember(session, menu)

    def _remember(self, session: str, menu: Menu) -> None:
        if self._known is not None and self._watching():
            self._known[session] = menu
