from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "apps.accounts"
    label = "accounts"

    def ready(self) -> None:
        from apps.accounts.models import Invitation
        from apps.core import quotas

        quotas.count_with("invitations", lambda org: Invitation.objects.filter(
            org=org, status=Invitation.Status.PENDING).count())
