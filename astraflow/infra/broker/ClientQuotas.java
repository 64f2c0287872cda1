// Alters and describes Kafka user (principal) quotas in one admin client: what
// astraflow/infra/broker/acls.py `set_quotas` runs, with Java's source launcher and the broker's jars,
// because confluent-kafka has no client quota API and kafka-configs.sh changes one user per JVM start.
import java.io.FileInputStream;
import java.util.*;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.common.quota.*;

/** ClientQuotas PROPERTIES [--fill USER:key=value,...]... [--set USER:key=value,...]...
 *  --fill: only users without any quota; --set: always; an empty value removes that quota.
 *  Prints every user's quotas afterwards, a line each: USER<TAB>key=value<TAB>... */
public class ClientQuotas {
    public static void main(String[] args) throws Exception {
        Properties properties = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) { properties.load(in); }
        ClientQuotaFilter users = ClientQuotaFilter.containsOnly(
            List.of(ClientQuotaFilterComponent.ofEntityType(ClientQuotaEntity.USER)));
        try (Admin admin = Admin.create(properties)) {
            Map<String, Map<String, Double>> current = describe(admin, users);
            Map<String, Map<String, Double>> changes = new TreeMap<>();
            boolean fill = false;
            for (int i = 1; i < args.length; i++) {
                if (args[i].equals("--fill") || args[i].equals("--set")) { fill = args[i].equals("--fill"); continue; }
                String[] spec = args[i].split(":", 2);
                if (fill && current.containsKey(spec[0])) continue;
                Map<String, Double> change = changes.computeIfAbsent(spec[0], user -> new TreeMap<>());
                for (String item : spec[1].split(",")) {
                    String[] pair = item.split("=", 2);
                    change.put(pair[0], pair[1].isEmpty() ? null : Double.valueOf(pair[1]));
                }
            }
            if (!changes.isEmpty()) {
                List<ClientQuotaAlteration> alterations = new ArrayList<>();
                for (Map.Entry<String, Map<String, Double>> change : changes.entrySet()) {
                    List<ClientQuotaAlteration.Op> ops = new ArrayList<>();
                    change.getValue().forEach((key, value) -> ops.add(new ClientQuotaAlteration.Op(key, value)));
                    ClientQuotaEntity user = new ClientQuotaEntity(
                        Collections.singletonMap(ClientQuotaEntity.USER, change.getKey()));
                    alterations.add(new ClientQuotaAlteration(user, ops));
                }
                admin.alterClientQuotas(alterations).all().get(60, TimeUnit.SECONDS);
                // a broker answers from its copy of the cluster's metadata: wait until it holds the change
                for (int attempt = 0; attempt < 100 && !holds(current = describe(admin, users), changes); attempt++) {
                    Thread.sleep(100);
                }
                if (!holds(current, changes)) throw new IllegalStateException("the quotas set are not described back");
            }
            for (Map.Entry<String, Map<String, Double>> user : current.entrySet()) {
                StringBuilder line = new StringBuilder(user.getKey());
                user.getValue().forEach((key, value) -> line.append('\t').append(key).append('=').append(value));
                System.out.println(line);
            }
        }
    }

    static Map<String, Map<String, Double>> describe(Admin admin, ClientQuotaFilter users) throws Exception {
        Map<String, Map<String, Double>> found = new TreeMap<>();
        admin.describeClientQuotas(users).entities().get(60, TimeUnit.SECONDS).forEach(
            (entity, quotas) -> found.put(
                Objects.requireNonNullElse(entity.entries().get(ClientQuotaEntity.USER), "<default>"),
                new TreeMap<>(quotas)));
        return found;
    }

    static boolean holds(Map<String, Map<String, Double>> current, Map<String, Map<String, Double>> changes) {
        for (Map.Entry<String, Map<String, Double>> change : changes.entrySet()) {
            Map<String, Double> quotas = current.getOrDefault(change.getKey(), Map.of());
            for (Map.Entry<String, Double> quota : change.getValue().entrySet()) {
                if (!Objects.equals(quotas.get(quota.getKey()), quota.getValue())) return false;
            }
        }
        return true;
    }
}
