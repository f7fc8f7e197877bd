// Validates Prometheus Operator resources (JSON array on stdin) with the validators that
// @kubernetes-models/prometheus-operator generates from the Operator's monitoring.coreos.com
// Go API types. Prints "ok KIND/NAME" or "invalid KIND/NAME: reason" per resource; exit 1
// if any is invalid.
import { readFileSync } from "node:fs";
import * as v1 from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";

const resources = JSON.parse(readFileSync(0, "utf8"));
let invalid = 0;
for (const resource of resources) {
  const name = `${resource.kind}/${resource.metadata?.name}`;
  const Model = resource.apiVersion === "monitoring.coreos.com/v1" ? v1[resource.kind] : undefined;
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
