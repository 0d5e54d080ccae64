from django.urls import path
from django.views.generic import RedirectView

from reconcile.views_readiness import readiness_page
from stopdesk.views import auth, items, queue, records, review, tasks

urlpatterns = [
    path("", RedirectView.as_view(pattern_name="task-list"), name="home"),
    path("login/", auth.RateLimitedLoginView.as_view(), name="login"),
    path("reauth/", auth.reauth, name="reauth"),
    path("tasks/", tasks.task_list, name="task-list"),
    path("tasks/<int:task_id>/", tasks.task_detail, name="task-detail"),
    path("tasks/<int:task_id>/stop/", tasks.task_stop, name="task-stop"),
    path("tasks/<int:task_id>/items/", tasks.task_items, name="task-items"),
    path("queue/", review.queue, name="review-queue"),
    path("readiness/", readiness_page, name="readiness"),
    path("items/<int:item_id>/", items.item_detail, name="item-detail"),
    path("items/<int:item_id>/report/", items.item_report_view, name="item-report"),
    path("items/<int:item_id>/resolve/", review.item_resolve_view, name="item-resolve"),
    path("items/<int:item_id>/extend/", review.item_extend_view, name="item-extend"),
    path("items/<int:item_id>/acknowledge/", review.item_acknowledge_view, name="item-acknowledge"),
    path("items/<int:item_id>/escalate/", review.item_escalate_view, name="item-escalate"),
    path("records/<int:record_id>/propose/", review.record_propose_view, name="record-propose"),
    path("compensations/<int:compensation_id>/", review.compensation_detail, name="compensation-detail"),
    path("compensations/<int:compensation_id>/approve/", review.compensation_approve_view, name="compensation-approve"),
    path("compensations/<int:compensation_id>/reject/", review.compensation_reject_view, name="compensation-reject"),
    path(
        "compensations/<int:compensation_id>/escalate/", review.compensation_escalate_view, name="compensation-escalate"
    ),
    path("queue/decide/", queue.queue_decide, name="queue-decide"),
    path("queue/acknowledge/", queue.queue_acknowledge, name="queue-acknowledge"),
    path("compensations/<int:compensation_id>/reread/", records.compensation_reread_view, name="compensation-reread"),
    path(
        "compensations/<int:compensation_id>/propose-current/",
        records.compensation_propose_current_view,
        name="compensation-propose-current",
    ),
    path("compensations/<int:compensation_id>/accept/", records.compensation_accept_view, name="compensation-accept"),
    path("records/accept/", records.records_accept_view, name="records-accept"),
    path("records/<int:record_id>/flag/", records.record_flag_view, name="record-flag"),
]
