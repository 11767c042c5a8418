from __future__ import annotations

from rest_framework import serializers

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


class SpaceCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=160, trim_whitespace=True)
    slug = serializers.CharField(max_length=160, required=False)
    description = serializers.CharField(
        max_length=2000, required=False, allow_blank=True, default=""
    )


class SpaceUpdateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=160, required=False)
    slug = serializers.CharField(max_length=160, required=False)
    description = serializers.CharField(max_length=2000, required=False, allow_blank=True)
    embedding_model_id = serializers.CharField(max_length=200, required=False)
    # Checked by spaces.services.checked_chunking (400 invalid_chunking).
    chunking = serializers.JSONField(required=False, allow_null=True)
    revision = serializers.IntegerField(required=False, min_value=1)
