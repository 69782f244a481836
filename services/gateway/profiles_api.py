"""``GET /v1/profiles``: the profile table the scheduler uses, with where each entry came from.

Why through the gateway: the CLI holds no NATS credentials, and every caller with a token may
read it (it names GPU models and speeds, nothing of any tenant). The gateway follows the
profiler's record in KV ``profiles`` (revalidated; an unsound one is refused and the last good
one kept) and builds the listing with the policy's own definition
(``libs.policy.profile_listing``) over the shipped table and the nodes it knows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aiohttp import web

from libs.bus.refusals import refused
from libs.policy.profile_listing import listing
from libs.policy.profiles import ProfileTable
from proto import subjects
from proto.profiles import ProfilesListing, ProfilesRecord, revalidate_profiles

if TYPE_CHECKING:
    from services.gateway.service import Gateway

PROFILES_ROUTE = "/v1/profiles"


class ProfilesModel:
    """The profiler's latest sound record (None: nothing learnt yet)."""

    def __init__(self, bus: Any) -> None:
        self.bus = bus
        self.base = ProfileTable.default()
        self.record: ProfilesRecord | None = None

    async def follow(self) -> ProfilesModel:
        kv = await self.bus.kv(subjects.KV_PROFILES, ProfilesRecord)
        await kv.watch(self._on_record, key=subjects.PROFILES_KEY)
        return self

    async def _on_record(self, key: str, rec: ProfilesRecord | None) -> None:
        if rec is None or not refused(self.bus, "profiles", revalidate_profiles(rec), key=key):
            self.record = rec

    def listing(self, nodes: Any) -> ProfilesListing:
        rec = self.record
        rows = rec.rows if rec is not None else ()
        views = listing(self.base, rows, list(nodes))
        return ProfilesListing(version=rec.version if rec is not None else 0, rows=tuple(views))


async def list_profiles(request: web.Request) -> web.Response:
    from services.gateway.api import GATEWAY_KEY, json_response

    gw: Gateway = request.app[GATEWAY_KEY]
    return json_response(gw.profiles.listing(gw.nodes.specs.values()))


def add_routes(app: web.Application) -> None:
    app.router.add_get(PROFILES_ROUTE, list_profiles)
