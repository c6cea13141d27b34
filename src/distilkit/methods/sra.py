"""SRA (Wu et al.), task-agnostic distillation by Sentence Representation Approximation (§3.1).

On unlabeled sentences, the student's sentence vector S_x = tanh(W H) approaches the teacher's
sentence embedding T_x, the final-layer hidden state of [CLS] (`pooling: mean` averages the final
layer over real tokens instead: this toolkit's option; the paper distils [CLS] only, and its "BERT (averaged)" is an
untuned baseline of Table 5), by eq. (1):

    L_distill = ½ (1 − T_x·S_x / (‖T_x‖ ‖S_x‖)).

Fine-tuning afterwards is `finetune` (labels) or `kd` with objective=logit_mse (SRA+KD, after
Tang et al.) on the task, starting from the distilled student.
"""

from typing import ClassVar, Literal

from pydantic import Field

from distilkit import losses
from distilkit.config import MethodParams
from distilkit.methods.base import Method, register_method, weighted
from distilkit.models.features import FeatureRequest


@register_method
class SRA(Method):
    name = "sra"

    class Params(MethodParams):
        student_kind: ClassVar[str] = "bilstm"  # S_x is the BiLSTM's sentence vector
        name: Literal["sra"] = "sra"
        pooling: Literal["cls", "mean"] = "cls"  # T_x: the teacher's final [CLS], or its mean-pooled final layer
        weight: float = Field(1.0, gt=0)

    def __init__(self, params, ctx):
        super().__init__(params, ctx)
        if ctx.student.width != ctx.teacher.width:
            raise ValueError(f"sra compares sentence vectors one to one: the student's is {ctx.student.width}-d, "
                             f"the teacher's {ctx.teacher.width}-d")

    def teacher_request(self):
        return FeatureRequest(hidden=frozenset({self.ctx.teacher.num_layers}))

    def student_request(self):
        return FeatureRequest()

    def loss_terms(self, batch, student, teacher, progress):
        if student.sentence is None:
            raise ValueError("sra distils a single sentence's vector S_x: use student.kind=bilstm on "
                             "single-sentence data (an unlabeled corpus with data.corpus.unit=sentence)")
        layer = self.ctx.teacher.num_layers
        target = teacher.cls(layer) if self.params.pooling == "cls" else teacher.mean_pooled(layer)
        return weighted({"sra": (self.params.weight, losses.sra_cosine(target, student.sentence))})
