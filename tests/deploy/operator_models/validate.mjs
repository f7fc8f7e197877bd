// Validates Kubernetes resources (JSON array on stdin) with validators generated from their
// published schemas: the Prometheus Operator's monitoring.coreos.com Go API types
// (@kubernetes-models/prometheus-operator), KEDA's keda.sh CRDs (@kubernetes-models/keda) and
// Kubernetes' own OpenAPI for autoscaling/v2 (kubernetes-models). Prints "ok KIND/NAME" or
// "invalid KIND/NAME: reason" per resource; exit 1 if any is invalid.
import { readFileSync } from "node:fs";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as autoscaling from "kubernetes-models/autoscaling/v2";

const groups = { "monitoring.coreos.com/v1": monitoring, "keda.sh/v1alpha1": keda, "autoscaling/v2": autoscaling };
const resources = JSON.parse(readFileSync(0, "utf8"));
let invalid = 0;
for (const resource of resources) {
  const name = `${resource.kind}/${resource.metadata?.name}`;
  const Model = groups[resource.apiVersion]?.[resource.kind];
  try {
    if (!Model) throw new Error(`unknown kind ${resource.apiVersion} ${resource.kind}`);
    new Model(resource).validate();
    console.log(`ok ${name}`);
  } catch (error) {
    invalid += 1;
    console.log(`invalid ${name}: ${error.message}`);
  }
}
process.exit(invalid ? 1 : 0);
