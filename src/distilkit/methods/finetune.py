"""Fine-tuning on labels only: how teachers are trained, and the no-distillation student baseline."""

from typing import ClassVar, Literal

from distilkit.config import MethodParams
from distilkit.methods.base import Method, register_method


@register_method
class Finetune(Method):
    name = "finetune"

    class Params(MethodParams):
        name: Literal["finetune"] = "finetune"
        needs_teacher: ClassVar[bool] = False

    def uses_labels(self):
        return True

    def loss_terms(self, batch, student, teacher, progress):
        return {"label": self.label_loss(student.logits, batch["labels"])}
