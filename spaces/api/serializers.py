from __future__ import annotations

from rest_framework import serializers

from knowledgefs.errors import InvalidInput
from spaces.models import KnowledgeSpace


class KnowledgeSpaceSerializer(serializers.ModelSerializer):
    index = serializers.SerializerMethodField()

    class Meta:
        model = KnowledgeSpace
        fields = [
            "id",
            "tenant_id",
            "name",
            "slug",
            "description",
            "revision",
            "embedding_model_id",
            "embedding_dimension",
            "chunking",
            "index",
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields

    def get_index(self, space) -> dict:
        """``{"active": {number, model_id, dimension} | None, "building": … | None}``."""
        return space.index_versions.summary()

    def to_representation(self, space) -> dict:
        """The space's fields, then ``readiness``, ``embedding_profile`` and
        ``retrieval_profile`` (:func:`spaces.profiles.describe`)."""
        from spaces.models import SpaceProfile
        from spaces.profiles import describe, profile_of

        data = super().to_representation(space)
        profile = None
        if KnowledgeSpace.profile.is_cached(space):  # select_related("profile")
            try:
                profile = space.profile
            except SpaceProfile.DoesNotExist:
                profile = None
        data.update(describe(profile or profile_of(space)))
        return data


#: The code refusing a member of the wrong type (the space fields' own codes, as their ranges).
TYPE_CODES = {"name": "invalid_name", "slug": "invalid_slug", "description": "invalid_description"}


class StrictBodySerializer(serializers.Serializer):
    """A JSON-object body whose members are exactly the declared fields, each of its declared
    JSON type: an unknown member is 400 ``invalid_request`` naming it and the members; a
    number, boolean, list or object where a string is declared (DRF's ``CharField`` would store
    ``5`` as ``"5"``) is 400 naming the member (``invalid_name``, ``invalid_slug``,
    ``invalid_description``, else ``invalid_request``), as every other route refuses them."""

    what = "knowledge-space"

    def to_internal_value(self, data):
        if isinstance(data, dict):
            members = tuple(self.fields)
            unknown = sorted(set(data) - set(members))
            if unknown:
                raise InvalidInput(
                    f"{unknown[0]}: not a {self.what} member (members: {', '.join(members)})",
                    code="invalid_request",
                    details={"field": unknown[0]},
                )
            for name, field in self.fields.items():
                if name in data:
                    self._check_type(name, field, data[name])
        return super().to_internal_value(data)

    @staticmethod
    def _check_type(name: str, field, value) -> None:
        if isinstance(field, serializers.CharField):
            expected, valid = "a string", isinstance(value, str)
        elif isinstance(field, serializers.IntegerField):
            expected = "an integer"
            valid = isinstance(value, int) and not isinstance(value, bool)
        else:
            return
        if not valid:
            raise InvalidInput(
                f"{name} must be {expected}, not {json_type(value)}",
                code=TYPE_CODES.get(name, "invalid_request"),
                details={"field": name},
            )


def json_type(value) -> str:
    """The JSON type name of a parsed value (for messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "a string"


class SpaceCreateSerializer(StrictBodySerializer):
    name = serializers.CharField(max_length=160, trim_whitespace=True)
    slug = serializers.CharField(max_length=160, required=False)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class SpaceUpdateSerializer(StrictBodySerializer):
    name = serializers.CharField(max_length=160, required=False)
    slug = serializers.CharField(max_length=160, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    embedding_model_id = serializers.CharField(max_length=200, required=False)
    # Checked by spaces.services.checked_chunking (400 invalid_chunking).
    chunking = serializers.JSONField(required=False, allow_null=True)
    revision = serializers.IntegerField(required=False, min_value=1)
