from __future__ import annotations

from rest_framework import serializers

from .models import KnowledgeSpace


class KnowledgeSpaceSerializer(serializers.ModelSerializer):
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
            "created_at",
            "updated_at",
        ]
        read_only_fields = fields


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
    revision = serializers.IntegerField(required=False, min_value=1)
