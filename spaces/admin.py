"""Operator screens for spaces and API keys. Every change goes through ``spaces.services``."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count
from django.utils import timezone

from knowledgefs.admin import ReadOnlyAdminMixin
from knowledgefs.auth.principal import Principal
from knowledgefs.errors import ServiceError

from . import api_keys, preflight, services
from .models import (
    ApiKey,
    ApiKeyBinding,
    BindingType,
    KnowledgeSpace,
    PublicationHead,
    Readiness,
    SpaceProfile,
)


class SpaceProfileInline(admin.StackedInline):
    """The space's profiles and readiness, read-only: they change through the API
    (``PUT …/embedding-profile``, ``PUT …/retrieval-profile``), ``kfs space`` or the
    *Validate profiles* action, whose rules live in :mod:`spaces.profiles`."""

    model = SpaceProfile
    can_delete = False
    extra = 0
    fieldsets = (
        ("Readiness", {"fields": ("state", "failure", "validated_at")}),
        (
            "Embedding profile",
            {
                "fields": (
                    "embedding_plugin_id",
                    "embedding_provider",
                    "embedding_model",
                    "embedding_identity",
                    "embedding_dimension",
                    "vector_space_id",
                    "embedding_revision",
                    "embedding_frozen_at",
                )
            },
        ),
        (
            "Retrieval profile",
            {
                "fields": (
                    "retrieval_default_mode",
                    "retrieval_reasoning_model",
                    "retrieval_rerank_enabled",
                    "retrieval_rerank_model",
                    "retrieval_score_threshold",
                    "retrieval_top_k",
                    "retrieval_revision",
                )
            },
        ),
        ("Observed by validation", {"fields": ("capabilities", "updated_at")}),
    )
    readonly_fields = [f.name for f in SpaceProfile._meta.fields if f.name != "space"]

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


class ReadinessFilter(admin.SimpleListFilter):
    title = "readiness"
    parameter_name = "readiness"

    def lookups(self, request, model_admin):
        return Readiness.choices

    def queryset(self, request, queryset):
        if self.value():
            return queryset.filter(profile__state=self.value())
        return queryset


class KnowledgeSpaceForm(forms.ModelForm):
    """The space rules of :mod:`spaces.services` on the admin form (name, description)."""

    class Meta:
        model = KnowledgeSpace
        fields = "__all__"

    def clean_name(self) -> str:
        try:
            return services._clean_name(self.cleaned_data.get("name"))
        except ServiceError as exc:
            raise ValidationError(exc.message) from None


@admin.register(KnowledgeSpace)
class KnowledgeSpaceAdmin(admin.ModelAdmin):
    form = KnowledgeSpaceForm
    list_display = (
        "name",
        "slug",
        "tenant_id",
        "readiness",
        "embedding_model_id",
        "revision",
        "created_at",
    )
    list_filter = (ReadinessFilter, "tenant_id")
    list_select_related = ("profile",)
    search_fields = ("name", "slug", "tenant_id", "=id")
    readonly_fields = (
        "id",
        "revision",
        "embedding_model_id",
        "embedding_dimension",
        "created_at",
        "updated_at",
        "deleting_at",
    )
    inlines = (SpaceProfileInline,)
    actions = ("validate_profiles",)
    show_full_result_count = False

    @admin.display(description="readiness", ordering="profile__state")
    def readiness(self, obj) -> str:
        try:
            return obj.profile.state
        except SpaceProfile.DoesNotExist:
            return "-"

    @admin.action(description="Validate profiles (run the preflight now)", permissions=["change"])
    def validate_profiles(self, request, queryset) -> None:
        for space in queryset:
            try:
                profile = preflight.run_preflight(space)
            except ServiceError as exc:
                self.message_user(
                    request, f"{space.slug}: {exc.code}: {exc.message}", messages.ERROR
                )
                continue
            failure = profile.failure or {}
            if profile.state == Readiness.READY:
                self.message_user(request, f"{space.slug}: ready", messages.SUCCESS)
            else:
                self.message_user(
                    request,
                    f"{space.slug}: {profile.state} ({failure.get('code')}: "
                    f"{failure.get('message')})",
                    messages.WARNING,
                )

    def has_add_permission(self, request) -> bool:
        return False  # spaces are created through the API, kfs or Dify's provisioning

    def get_readonly_fields(self, request, obj=None):
        # The tenant and the slug are identities (keys, objects and Dify refer to them).
        return (*self.readonly_fields, "tenant_id", "slug")

    def save_model(self, request, obj, form, change) -> None:
        # Name and description go through the service: its validation and revision bump.
        changes = {
            f: form.cleaned_data[f] for f in ("name", "description") if f in form.changed_data
        }
        if changes:
            services.update_space(Principal(tenant_id=obj.tenant_id), obj.id, changes=changes)

    def delete_model(self, request, obj) -> None:
        # The service purges documents and stored objects and deletes keys bound only here.
        services.delete_space(Principal(tenant_id=obj.tenant_id), obj.id)

    def delete_queryset(self, request, queryset) -> None:
        for space in queryset:
            self.delete_model(request, space)

    def get_deleted_objects(self, objs, request):
        # Documents, index versions and jobs cannot be deleted on their own, but the service
        # removes them with their space: the permission to delete the space is enough.
        deleted, counts, _perms_needed, protected = super().get_deleted_objects(objs, request)
        return deleted, counts, set(), protected


@admin.register(PublicationHead)
class PublicationHeadAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    """Read-only: a publication head is moved only by publishing."""

    list_display = ("space", "revision", "published_at")
    list_select_related = ("space",)
    readonly_fields = ("space", "revision", "published_at")


# --- API keys -------------------------------------------------------------------------------


class KeyStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return (("active", "Active"), ("revoked", "Revoked"))

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class BindingForm(forms.ModelForm):
    """One new binding; checked by the same rules as ``api_keys.bind_api_key``."""

    class Meta:
        model = ApiKeyBinding
        fields = ("resource_type", "space", "dataset_id")

    def clean(self):
        data = super().clean() or {}
        kind, space, dataset = data.get("resource_type"), data.get("space"), data.get("dataset_id")
        if kind == BindingType.KNOWLEDGE_FS_SPACE and (space is None or dataset):
            raise ValidationError("a knowledge-space binding names a space and no dataset id")
        if kind == BindingType.DATASET and (space is not None or not dataset):
            raise ValidationError("a dataset binding names a dataset id and no space")
        return data


class ApiKeyBindingInline(admin.TabularInline):
    """Existing bindings are read-only (delete and add instead); saving goes through
    :meth:`ApiKeyAdmin.save_formset`, so removing the last binding revokes the key."""

    model = ApiKeyBinding
    form = BindingForm
    fields = ("resource_type", "space", "dataset_id", "created_at")
    readonly_fields = ("created_at",)
    extra = 0
    verbose_name_plural = "Bindings (none: the key reaches every space of its tenant)"

    def get_formset(self, request, obj=None, **kwargs):
        formset = super().get_formset(request, obj, **kwargs)
        field = formset.form.base_fields.get("space")
        if obj is not None and isinstance(field, forms.ModelChoiceField):  # (the space FK's)
            field.queryset = KnowledgeSpace.objects.filter(
                tenant_id=obj.tenant_id, deleting_at__isnull=True
            ).order_by("slug")
        return formset

    def has_change_permission(self, request, obj=None) -> bool:
        return False  # a binding is added or removed, never edited in place

    def has_add_permission(self, request, obj=None) -> bool:
        return bool(obj and obj.revoked_at is None) and request.user.has_perm(
            "spaces.change_apikey"
        )

    def has_delete_permission(self, request, obj=None) -> bool:
        return bool(obj and obj.revoked_at is None) and request.user.has_perm(
            "spaces.change_apikey"
        )

    def has_view_permission(self, request, obj=None) -> bool:
        return request.user.has_perm("spaces.view_apikey") or request.user.has_perm(
            "spaces.change_apikey"
        )


class ApiKeyCreationForm(forms.ModelForm):
    """Create a key through ``api_keys.create_api_key``; the secret is shown once."""

    spaces = forms.ModelMultipleChoiceField(
        queryset=KnowledgeSpace.objects.filter(deleting_at__isnull=True).order_by(
            "tenant_id", "slug"
        ),
        required=False,
        help_text="Spaces of the key's tenant it is bound to. None (and no dataset): the whole "
        "tenant.",
    )
    datasets = forms.CharField(
        required=False,
        help_text="Dify dataset ids it is bound to, separated by spaces or commas.",
    )

    class Meta:
        model = ApiKey
        fields = ("tenant_id", "name")

    def clean_datasets(self) -> list[str]:
        raw = self.cleaned_data.get("datasets") or ""
        datasets = [d for d in raw.replace(",", " ").split() if d]
        try:
            return [api_keys.validate_dataset_id(d) for d in datasets]
        except ServiceError as exc:
            raise ValidationError(exc.message) from None

    def clean_name(self) -> str:
        try:
            return api_keys.validate_key_name(self.cleaned_data.get("name") or "")
        except ServiceError as exc:
            raise ValidationError(exc.message) from None

    def clean(self):
        data = super().clean() or {}
        tenant = data.get("tenant_id")
        if tenant:
            try:
                services.validate_tenant_id(tenant)
            except ServiceError as exc:
                self.add_error("tenant_id", exc.message)
            wrong = [s.slug for s in data.get("spaces") or [] if s.tenant_id != tenant]
            if wrong:
                self.add_error("spaces", f"not spaces of tenant {tenant}: {', '.join(wrong)}")
        return data


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = (
        "prefix",
        "name",
        "tenant_id",
        "state",
        "binding_summary",
        "created_at",
        "last_used_at",
        "revoked_at",
    )
    list_filter = ("tenant_id", KeyStateFilter)
    search_fields = ("prefix", "name", "tenant_id")
    actions = ["revoke"]
    inlines = [ApiKeyBindingInline]

    def get_queryset(self, request):
        return super().get_queryset(request).annotate(binding_count=Count("bindings"))

    @admin.display(description="state")
    def state(self, obj) -> str:
        return "Active" if obj.revoked_at is None else "Revoked"

    @admin.display(description="bindings")
    def binding_summary(self, obj) -> str:
        count = getattr(obj, "binding_count", None)
        if count is None:
            count = obj.bindings.count()
        return f"{count} bound" if count else "whole tenant"

    # The secret is never shown (only its prefix); key_hash is not shown either.
    def get_fields(self, request, obj=None):
        if obj is None:
            return ("tenant_id", "name", "spaces", "datasets")
        return ("id", "prefix", "tenant_id", "name", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("id", "prefix", "tenant_id", "created_at", "last_used_at", "revoked_at")

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = ApiKeyCreationForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_inlines(self, request, obj):
        return self.inlines if obj is not None else []

    def save_model(self, request, obj, form, change) -> None:
        if change:
            obj.save(update_fields=["name"])
            return
        try:
            key, secret = api_keys.create_api_key(
                form.cleaned_data["tenant_id"],
                spaces=list(form.cleaned_data.get("spaces") or []),
                datasets=form.cleaned_data.get("datasets") or [],
                name=form.cleaned_data.get("name") or "",
            )
        except ServiceError as exc:  # changed since the form was checked
            self.message_user(
                request, f"No key was created: {exc.code}: {exc.message}", messages.ERROR
            )
            return
        obj.pk, obj.prefix, obj.created_at = key.pk, key.prefix, key.created_at
        obj._state.adding = False
        self.message_user(
            request,
            f"The new key's secret, shown this once (copy it now): {secret}",
            messages.WARNING,
        )

    def save_formset(self, request, form, formset, change) -> None:
        """Bindings change only through the services: new ones first, then removals, so
        replacing a key's only binding never passes through zero; removing the last one
        revokes the key."""
        if formset.model is not ApiKeyBinding:
            return super().save_formset(request, form, formset, change)
        key = form.instance
        formset.save(commit=False)
        for binding in formset.new_objects:
            is_space = binding.resource_type == BindingType.KNOWLEDGE_FS_SPACE
            try:
                api_keys.bind_api_key(
                    key,
                    binding.space if is_space else None,
                    dataset_id=None if is_space else binding.dataset_id,
                )
            except ServiceError as exc:
                # Changed since the form was checked (e.g. the space's deletion started):
                # remove nothing either, so the key keeps the scope it had.
                self.message_user(
                    request,
                    f"Key {key.prefix}: binding {binding} refused ({exc.code}: {exc.message}); "
                    "no binding was removed.",
                    messages.ERROR,
                )
                formset.new_objects = formset.changed_objects = formset.deleted_objects = []
                return
        for binding in formset.deleted_objects:
            result = api_keys.unbind_api_key(key, binding)
            if result.revoked:
                self.message_user(
                    request,
                    f"Key {key.prefix} lost its last binding and was revoked (a key with no "
                    "bindings would reach the whole tenant).",
                    messages.WARNING,
                )
        formset.new_objects = formset.changed_objects = formset.deleted_objects = []

    def delete_model(self, request, obj) -> None:
        api_keys.delete_api_key(obj)

    def delete_queryset(self, request, queryset) -> None:
        for key in queryset:
            api_keys.delete_api_key(key)

    @admin.action(description="Revoke selected keys (immediately)", permissions=["change"])
    def revoke(self, request, queryset) -> None:
        count = 0
        for key in queryset.filter(revoked_at__isnull=True):
            api_keys.revoke_api_key(key)
            count += 1
        self.message_user(
            request, f"Revoked {count} API keys at {timezone.now():%H:%M:%S} UTC.", messages.SUCCESS
        )
